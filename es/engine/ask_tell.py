"""Ask/tell: drive a generation yourself when the fitness cannot run inside JAX.

    population = es.ask(strategy, state)                 # params pytree, leading axis popsize
    fitness = np.array([simulate(member) for member in unstack(population)])
    state, metrics = es.tell(strategy, state, fitness)   # float[popsize]

``ask`` rebuilds the members exactly as ``es.evolve`` builds them (same keys,
same code), and ``tell`` runs ``es.evolve``'s generation step with the
evaluation replaced by the given fitnesses, so only fitnesses come back: the
noise is rebuilt from the state's keys, never passed in. For a fitness that
ignores its key, an ask/tell loop that computes the same fitness values gives
the same params as ``es.evolve``, bit for bit.

``ask(..., members=range(start, stop))`` builds only those members, so a loop
over a large model can hold one chunk at a time. ``es.population.eval_key``
gives the key ``es.evolve`` would pass a member's fitness.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from es.engine import generation as engine
from es.parallel.distributed import replicate
from es.fitness.functions import GivenFitness
from es.noise.layout import Layout
from es.parallel.mesh import resolve_mesh
from es.strategies.base import State, Strategy

PyTree = Any


def ask(strategy: Strategy, state: State, members: range | None = None, *, eval_batch_size: int | None = None) -> PyTree:
    """The params of this generation's members: ``state.params``'s pytree with a leading member axis.

    Args:
      strategy: the strategy of ``state``.
      state: from ``strategy.init`` or a previous ``tell``/``evolve``.
      members: a ``range`` of member indices (step 1) within ``[0, popsize)``;
        ``None`` for all ``popsize`` members.
      eval_batch_size: as for ``es.evolve``; only decides, as there, whether
        antithetic pairs are built from one draw (the result is the same up
        to the rounding that docs/design.md describes; pass the value you
        give ``es.evolve`` to compare with it bit for bit).
    """
    _check(strategy, state, "ask")
    start, stop = _member_range(strategy, members)
    execution = engine.resolve_execution(strategy, Layout.of(state.params), "fitness", eval_batch_size, None)
    pairs = engine.evaluates_pairs(strategy, stop - start, execution.eval_batch_size) and start % 2 == 0
    return _ask_compiled(strategy, start, stop, pairs, state)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _ask_compiled(strategy, start, stop, pairs, state):
    noise_aux = strategy.noise.prepare(Layout.of(state.params))
    return engine.this_generation(strategy, noise_aux, state).members(jnp.arange(start, stop, dtype=jnp.int32), pairs)


def tell(
    strategy: Strategy,
    state: State,
    fitness,
    *,
    update_batch_size: int | None = None,
) -> tuple[State, dict[str, jax.Array]]:
    """Update ``state`` from the fitnesses of the members ``ask`` returned; one generation.

    Args:
      strategy: the strategy of ``state``.
      state: the state ``ask`` was called with.
      fitness: ``float[popsize]``, member order (higher is better when
        ``strategy.maximize``); NaN/inf mark failed members, as in ``evolve``.
      update_batch_size: as for ``es.evolve`` (it fixes the summation order:
        give the same value to match ``evolve`` bit for bit).

    Returns:
      ``(state, metrics)``: the next state and this generation's metrics
      (scalars; the names of ``es.METRIC_NAMES``).
    """
    _check(strategy, state, "tell")
    if state.fitness_state is not None:
        raise ValueError(
            "es.tell: state.fitness_state is not None (the state was made for a StatefulFitness), but tell "
            "receives fitnesses only; use es.evolve for a StatefulFitness, or a state made with "
            "strategy.init(key, params)."
        )
    values = np.asarray(fitness)
    if values.shape != (strategy.popsize,) or not (
        np.issubdtype(values.dtype, np.floating) or np.issubdtype(values.dtype, np.integer)
    ):
        raise ValueError(
            f"es.tell: fitness must be a real array of shape ({strategy.popsize},) (one value per member, in "
            f"member order), got {values.dtype}{list(values.shape)}."
        )
    execution = engine.resolve_execution(strategy, Layout.of(state.params), "fitness", None, update_batch_size)
    mesh = resolve_mesh(None)
    state, metrics = _tell_compiled(strategy, mesh, execution, replicate(state, mesh), jnp.asarray(values, jnp.float32))
    return state, jax.tree.map(lambda m: m[0], metrics)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _tell_compiled(strategy, mesh, execution, state, values):
    def one_generation(state, values):
        return engine.run_generations(strategy, GivenFitness(values), mesh, execution, 1, state)

    return jax.shard_map(one_generation, mesh=mesh, in_specs=(P(), P()), out_specs=P(), check_vma=False)(
        state, values
    )


def _check(strategy: Strategy, state: State, name: str) -> None:
    if not isinstance(strategy, Strategy):
        raise TypeError(f"es.{name}: strategy must be an es strategy (es.OpenES, es.SNES, ...), got "
                        f"{type(strategy).__name__}.")
    engine.check_state(strategy, None, state)
    engine.check_noise(strategy, state, Layout.of(state.params))


def _member_range(strategy: Strategy, members) -> tuple[int, int]:
    if members is None:
        return 0, strategy.popsize
    if not isinstance(members, range) or members.step != 1:
        raise TypeError(
            f"es.ask(members={members!r}): members must be a range of member indices with step 1, e.g. "
            f"range(0, {min(64, strategy.popsize)}), or None for all {strategy.popsize}."
        )
    if not (0 <= members.start < members.stop <= strategy.popsize):
        raise ValueError(
            f"es.ask(members={members!r}): the range must be non-empty and within [0, popsize={strategy.popsize})."
        )
    return members.start, members.stop
