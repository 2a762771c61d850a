"""A run from its seed: the one way every front end turns ``seed`` into initial params and a run key.

    state = es.init_from_seed(strategy, seed, task.init_params, fitness=task.fitness)

``init_key, run_key = jax.random.split(jax.random.key(seed))``: the initial
params are ``init_params(init_key)`` and every draw of the run derives from
``run_key``. ``python -m experiments.train``, ``experiments.reproduce`` and
the benchmarks all start runs this way, so one seed names one run everywhere.
"""

from __future__ import annotations

from typing import Any, Callable

import jax

from es import validation
from es.strategies.base import State, Strategy

PyTree = Any


def seed_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """``(init_key, run_key)`` of run ``seed`` (an int >= 0)."""
    validation.check_int("es.init_from_seed", "seed", seed, 0)
    init_key, run_key = jax.random.split(jax.random.key(seed))
    return init_key, run_key


def init_from_seed(
    strategy: Strategy, seed: int, init_params: Callable[[jax.Array], PyTree], fitness: Callable | None = None
) -> State:
    """The initial state of run ``seed``: params ``init_params(init_key)``, run key ``run_key``.

    Args:
      strategy: the run's strategy.
      seed: an int >= 0.
      init_params: ``key -> params``, e.g. ``task.init_params``.
      fitness: as for ``strategy.init`` (a ``StatefulFitness`` gives the
        state its ``fitness_state``).
    """
    if not callable(init_params):
        raise TypeError(
            f"es.init_from_seed(init_params={init_params!r}): init_params must be a function key -> params, "
            "e.g. task.init_params."
        )
    init_key, run_key = seed_keys(seed)
    return strategy.init(run_key, init_params(init_key), fitness=fitness)
