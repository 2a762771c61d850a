"""Fitness outside JAX: ``es.HostFitness`` evaluates members in a pool of worker processes."""

from es.host.pool import STOP_TIMEOUT_S, FitnessError, HostFitness, member_seed

__all__ = ["FitnessError", "HostFitness", "STOP_TIMEOUT_S", "member_seed"]
