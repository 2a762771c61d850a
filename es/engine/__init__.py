"""The engine: generations in ``lax.scan``, the population ``shard_map``ped over a mesh, ask/tell and sweeps."""

from es.engine.ask_tell import ask, tell
from es.engine.generation import (
    EXCHANGE_MODES, METRIC_NAMES, Execution, check_evolve_args, evolve, evolve_checked, generation_step, num_params,
)
from es.engine.sweep import check_evolve_many_args, evolve_many, evolve_many_checked

__all__ = [
    "EXCHANGE_MODES", "METRIC_NAMES", "Execution", "ask", "check_evolve_args", "check_evolve_many_args", "evolve",
    "evolve_checked", "evolve_many", "evolve_many_checked", "generation_step", "num_params", "tell",
]
