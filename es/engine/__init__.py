"""The engine: generations in ``lax.scan``, the population ``shard_map``ped over a mesh, ask/tell and sweeps.

Modules, in the order a generation runs through them: ``members`` (keys and the population, rebuilt on
demand), ``batching`` (bounded loops over members), ``generation`` (``generation_step``, its phases
labelled), ``sums`` (step 4), ``update`` and ``partition`` (step 5, the one update path), ``stopping``;
around them ``execution`` (how a run executes, and the checks), ``evolve``, ``ask_tell``, ``sweep``.

Names are loaded on first use, so that the low modules (``members``, ``batching``) import without the rest.
"""

import importlib

_NAMES = {
    "ask": "ask_tell", "tell": "ask_tell", "stop_reasons": "ask_tell",
    "EXCHANGE_MODES": "execution", "Execution": "execution", "check_evolve_args": "execution",
    "num_params": "execution", "resolve_execution": "execution", "check_state": "execution",
    "trace_update": "execution",
    "evolve": "evolution", "evolve_checked": "evolution",
    "METRIC_NAMES": "generation", "generation_step": "generation",
    "evolve_many": "sweep", "evolve_many_checked": "sweep", "check_evolve_many_args": "sweep",
    "StopCriteria": "stopping",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'es.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"es.engine.{_NAMES[name]}"), name)
