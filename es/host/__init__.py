"""Fitness outside JAX: ``es.HostFitness`` (``fitness.py``) evaluates members in a pool of worker processes
(``pool.py``; ``pickled_code.py`` keeps a shipped function's source for tracebacks)."""

from es.host.fitness import HostFitness
from es.host.pool import STOP_TIMEOUT_S, FitnessError, member_seed

__all__ = ["FitnessError", "HostFitness", "STOP_TIMEOUT_S", "member_seed"]
