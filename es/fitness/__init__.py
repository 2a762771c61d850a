"""What the engine evaluates: the ``Fitness`` contract, and the fitness kinds users pass (JAX functions,
``es.StatefulFitness``, ``es.CommonRandomNumbers``; ``es.HostFitness`` lives in ``es.host``)."""

from es.fitness.contract import Fitness, FitnessError, Fitnesses, fitness_dtype, from_host
from es.fitness.functions import (
    CommonRandomNumbers, GivenFitness, JaxFitness, SharedKeys, StatefulFitness, adapter, check_fitness_output,
    check_shared_by,
)

__all__ = [
    "CommonRandomNumbers", "Fitness", "FitnessError", "Fitnesses", "GivenFitness", "JaxFitness", "SharedKeys", "StatefulFitness",
    "adapter", "check_fitness_output", "check_shared_by", "fitness_dtype", "from_host",
]
