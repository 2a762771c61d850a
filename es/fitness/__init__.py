"""What the engine evaluates: fitness functions, ``es.StatefulFitness``, ``es.CommonRandomNumbers``, and the
adapter every entry point wraps them in."""

from es.fitness.functions import (
    CommonRandomNumbers, FitnessRef, GivenFitness, StatefulFitness, adapter, check_fitness_output, check_shared_by,
)

__all__ = [
    "CommonRandomNumbers", "FitnessRef", "GivenFitness", "StatefulFitness", "adapter", "check_fitness_output",
    "check_shared_by",
]
