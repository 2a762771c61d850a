"""Fitness outside JAX: ``es.HostFitness`` (``fitness.py``) evaluates members in a pool of worker processes
(``pool.py``; ``pickled_code.py`` keeps a shipped function's source for tracebacks)."""

from es.host.fitness import HostFitness
from es.engine.members import member_seed
from es.fitness.contract import FitnessError
from es.host.pool import STOP_TIMEOUT_S

__all__ = ["FitnessError", "HostFitness", "STOP_TIMEOUT_S", "member_seed"]
