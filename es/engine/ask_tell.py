"""Ask/tell: drive a generation yourself when the fitness cannot run inside JAX.

    population = es.ask(strategy, state)                 # params pytree, leading axis popsize
    fitness = np.array([simulate(member) for member in unstack(population)])
    state, metrics = es.tell(strategy, state, fitness)   # float[popsize], float64 welcome
    if es.stop_reasons(strategy, state): ...             # why it should stop, in words

``ask`` rebuilds the members exactly as ``es.evolve`` builds them (same keys,
same code), and ``tell`` runs ``es.evolve``'s generation step with the
evaluation replaced by the given fitnesses, so only fitnesses come back: the
noise is rebuilt from the state's keys, never passed in. For a fitness that
ignores its key, an ask/tell loop that computes the same fitness values gives
the same params as ``es.evolve``, bit for bit.

Fitnesses keep float64's precision: ``tell`` hands the engine each value
rounded to the fitness dtype and what rounding dropped (``es.fitness.from_host``),
and the engine ranks them at full precision. The checks of a (strategy, state
shapes) pair run once and are remembered, and so are the compiled programs
(per strategy, settings, state shapes and dtype, compiled ahead of time), so a
generation traces nothing. For a small population (``popsize x params`` up to
``NEXT_MEMBERS_LIMIT``) ``tell`` also builds the next generation's members in
the same call, with ``ask``'s own code, and ``ask`` of the state it returned
hands them back: one call of compiled code per generation, the same bits.

``ask(..., members=range(start, stop))`` builds only those members, so a loop
over a large model can hold one chunk at a time. ``es.engine.members.eval_key``
gives the key ``es.evolve`` would pass a member's fitness.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from es import validation
from es.engine import stopping
from es.engine.evolution import run_generations
from es.engine.execution import check_noise, check_state, remember, resolve_execution, signature
from es.engine.generation import evaluates_pairs, this_generation
from es.fitness import GivenFitness, from_host
from es.fitness.contract import fitness_dtype
from es.noise import Layout
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
    if members is None and eval_batch_size is None:
        built = _LAST_TELL.members_of(strategy, state)
        if built is not None:
            return built
    checked = _checked(strategy, state, "ask")
    start, stop = _member_range(strategy, members)

    def make():
        pairs = _pairs(strategy, checked.layout, stop - start, eval_batch_size) and start % 2 == 0
        program, hp, _, _ = _prepared(strategy, checked.layout, None, None)
        return _ahead_of_time(checked, _ask_compiled, (program, start, stop, pairs), hp, state), hp

    compiled, hp = checked.program(("ask", start, stop, eval_batch_size), make)
    return compiled(hp, state)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _ask_compiled(program, start, stop, pairs, hp, state):
    return _members(program, start, stop, pairs, hp, state)


def _members(program, start, stop, pairs, hp, state):
    noise_aux = program.noise.prepare(Layout.of(state.params))
    return this_generation(program, hp, noise_aux, state).members(jnp.arange(start, stop, dtype=jnp.int32), pairs)


def tell(
    strategy: Strategy,
    state: State,
    fitness,
    *,
    update_batch_size: int | None = None,
    stop_criteria: stopping.StopCriteria | None = None,
) -> tuple[State, dict[str, jax.Array]]:
    """Update ``state`` from the fitnesses of the members ``ask`` returned; one generation.

    Args:
      strategy: the strategy of ``state``.
      state: the state ``ask`` was called with. ``tell`` cannot see which
        members the fitnesses belong to: given those of another state's
        members (a stale ``ask``), it updates this state with them all the same.
      fitness: ``float[popsize]``, member order (higher is better when
        ``strategy.maximize``); NaN/inf mark failed members, as in ``evolve``.
        float64 values keep their precision (the engine ranks them in full).
      update_batch_size: as for ``es.evolve`` (it fixes the summation order:
        give the same value to match ``evolve`` bit for bit).
      stop_criteria: the thresholds of the stopping conditions reported in
        ``metrics["stop"]`` (``es.StopCriteria()``: pycma's); ``None``: none
        computed (``"stop"`` is 0; ``es.stop_reasons`` still says them).

    Returns:
      ``(state, metrics)``: the next state and this generation's metrics
      (scalars; the names of ``es.METRIC_NAMES``; ``"stop"`` says which
      stopping conditions hold, ``es.stop_reasons`` in words).
    """
    checked = _LAST_TELL.checked_for(strategy, state) or _checked(strategy, state, "tell")
    if state.fitness_state is not None:
        raise ValueError(
            "es.tell: state.fitness_state is not None (the state was made for a StatefulFitness), but tell "
            "receives fitnesses only; use es.evolve for a StatefulFitness, or a state made with "
            "strategy.init(key, params)."
        )
    given = from_host(_fitness_values(strategy, fitness), "es.tell")

    def make():
        program, hp, mesh, execution = _prepared(strategy, checked.layout, update_batch_size, stop_criteria)
        # A small population's next members are built by the same call (the program es.ask would run, so the
        # same bits), and the next es.ask of the returned state hands them back: one compiled call a generation.
        next_pairs = None
        if _builds_next(strategy, checked):
            next_pairs = _pairs(strategy, checked.layout, strategy.popsize, None)
        return _ahead_of_time(checked, _tell_compiled, (program, mesh, execution, next_pairs), hp, state, given), hp

    compiled, hp = checked.program(("tell", update_batch_size, stop_criteria), make)
    new_state, metrics, members = _keyed(compiled(hp, state, given), state.key)
    _LAST_TELL.remember(strategy, new_state, members, checked)
    return new_state, metrics


NEXT_MEMBERS_LIMIT = 2**20
"""``es.tell`` also builds the next generation's members when ``popsize x params`` is at most this many
values (a black-box population; never a large model's, which ``ask`` builds in chunks)."""


def _builds_next(strategy: Strategy, checked: _Checked) -> bool:
    return checked.cached and strategy.popsize * checked.layout.dim <= NEXT_MEMBERS_LIMIT


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _tell_compiled(program, mesh, execution, next_pairs, hp, state, given):
    """One generation from the given fitnesses: ``(state, metrics, members)``, ``members`` the next
    generation's (as ``_ask_compiled`` builds them with ``pairs=next_pairs``), or ``None`` for ``next_pairs=None``.
    The returned state's ``key`` is ``None``: a generation never changes it, and the caller puts back its own
    (an output buffer and a key array less per call)."""
    def one_generation(hp, state, given):
        return run_generations(program, GivenFitness(given), mesh, execution, 1, hp, state)

    state, metrics = jax.shard_map(one_generation, mesh=mesh, in_specs=(P(), P(), P()), out_specs=P(),
                                   check_vma=False)(hp, state, given)
    members = None if next_pairs is None else _members(program, 0, program.popsize, next_pairs, hp, state)
    return state._replace(key=None), jax.tree.map(lambda m: m[0], metrics), members


def _keyed(outputs: tuple, key: jax.Array) -> tuple:
    """A tell program's ``(state, ...)`` with the run's ``key`` put back in the state (the program returns
    none: a generation never changes it)."""
    state, *rest = outputs
    return (state._replace(key=key), *rest)


class _LastTell(threading.local):
    """What this thread's last ``tell`` knows of the state it returned (one entry): the next members it built,
    and the checks its (strategy, state signature) passed (the same for the state it returned)."""

    strategy = state = members = checked = None

    def remember(self, strategy: Strategy, state: State, members, checked: _Checked) -> None:
        self.strategy, self.state, self.members, self.checked = strategy, state, members, checked

    def _is_last(self, strategy: Strategy, state: State) -> bool:
        return state is self.state and (strategy is self.strategy or strategy == self.strategy)

    def members_of(self, strategy: Strategy, state: State):
        return self.members if self.members is not None and self._is_last(strategy, state) else None

    def checked_for(self, strategy: Strategy, state: State) -> _Checked | None:
        return self.checked if self.checked is not None and self._is_last(strategy, state) else None


_LAST_TELL = _LastTell()


def stop_reasons(strategy: Strategy, state: State, stop_criteria: stopping.StopCriteria | None = None) -> list[str]:
    """Why ``state`` should stop, in words (``"name: what it means"`` per condition met; ``[]``: go on).

    The conditions of ``es.engine.stopping`` after the state's last
    generation (the metric ``"stop"`` of that ``tell``/``evolve`` call, for
    the same ``stop_criteria``). The conditions on the recent fitnesses
    (``tolfun``, ``tolfunhist``, ``stagnation``) read the history that only
    calls given ``stop_criteria`` record; the others read the state alone.
    Stopping never changes what a further generation does; it is yours (or
    ``es.minimize``'s) to act on.
    """
    checked = _checked(strategy, state, "stop_reasons")
    layout = checked.layout
    criteria = stop_criteria or stopping.StopCriteria()
    if not isinstance(criteria, stopping.StopCriteria):
        raise TypeError(f"es.stop_reasons(stop_criteria={stop_criteria!r}): use an es.StopCriteria(...) or None.")

    def make():  # ahead of time, as tell's: one program for a state from init and the states tell returns
        hp = strategy.hyperparameters(layout.dim)
        return _ahead_of_time(checked, _stop_mask, (strategy.program(), criteria), hp, state), hp

    compiled, hp = checked.program(("stop_reasons", criteria), make)
    return stopping.reasons(int(compiled(hp, state)), layout.dim, strategy.popsize, criteria)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _stop_mask(program, criteria, hp, state):
    return stopping.bitmask(stopping.state_conditions(program, hp, state, criteria))


# --------------------------------------------------------------------------- checks, made once


class _Checked:
    """A (strategy, state signature) pair that passed the checks: the params' layout, and the programs compiled
    for it (``(compiled program, hyperparameters)`` per call settings and dtype)."""

    def __init__(self, layout: Layout, cached: bool):
        self.layout, self.cached, self.programs = layout, cached, {}

    def program(self, settings: tuple, make: Callable[[], tuple]) -> tuple:
        """``make()``'s ``(program, hyperparameters)`` for ``settings`` (and this thread's dtype), made once."""
        key = (settings, fitness_dtype())
        try:
            return self.programs[key]
        except KeyError:
            made = make()
            if self.cached:
                remember(self.programs, key, made)
            return made


def _checked(strategy: Strategy, state: State, name: str) -> _Checked:
    """Check ``strategy`` and ``state``, once per strategy and state signature (not remembered for an
    unhashable strategy)."""
    if not isinstance(strategy, Strategy):
        raise TypeError(f"es.{name}: strategy must be an es strategy (es.OpenES, es.SNES, es.CMAES, ...), got "
                        f"{type(strategy).__name__}.")
    if not isinstance(state, State):
        raise TypeError(f"es.{name}: state must be an es.State from strategy.init(key, params), got "
                        f"{type(state).__name__}.")
    key = signature(strategy, state)
    try:
        return _CHECKED[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable strategy: checked every time
        key = None
    check_state(strategy, None, state)
    layout = Layout.of(state.params)
    check_noise(strategy, state, layout)
    checked = _Checked(layout, cached=key is not None)
    if key is not None:
        remember(_CHECKED, key, checked)
    return checked


_CHECKED: dict = {}  # (strategy, state signature) -> _Checked


def _ahead_of_time(checked: _Checked, jitted, static: tuple, hp, *args):
    """``jitted`` for ``static``, compiled ahead of time for these argument shapes (called directly after: no
    tracing, no jit dispatch); for a pair that is not remembered, ``jitted`` itself."""
    if not checked.cached:
        return functools.partial(jitted, *static)
    return jitted.lower(*static, hp, *args).compile()


@functools.lru_cache(maxsize=512)
def _pairs(strategy: Strategy, layout: Layout, count: int, eval_batch_size) -> bool:
    execution = resolve_execution(strategy, layout, "fitness", eval_batch_size, None)
    return evaluates_pairs(strategy, count, execution.eval_batch_size)


def _prepared(strategy: Strategy, layout: Layout, update_batch_size, stop_criteria):
    """``(program, hyperparameters as arrays, mesh, execution)`` of ``tell``, made once per strategy, params
    layout, settings and dtype (float64 under ``jax_enable_x64``)."""
    key = (strategy, layout, update_batch_size, stop_criteria, jnp.result_type(float))
    try:
        return _PREPARED[key]
    except (KeyError, TypeError):  # not yet, or an unhashable strategy
        pass
    execution = resolve_execution(strategy, layout, "fitness", None, update_batch_size, fitness=GivenFitness,
                                  stop_criteria=stop_criteria)
    hp = jax.tree.map(lambda v: jax.device_put(np.asarray(v, jnp.result_type(float))),  # put: no program compiled
                      strategy.hyperparameters(layout.dim))
    prepared = (strategy.program(), hp, resolve_mesh(None), execution)
    try:
        remember(_PREPARED, key, prepared)
    except TypeError:
        pass
    return prepared


_PREPARED: dict = {}


def _fitness_values(strategy: Strategy, fitness) -> np.ndarray:
    """``fitness`` as a float64 array of shape ``(popsize,)``, or a ``ValueError`` naming what is wrong."""
    values = np.asarray(fitness)
    if values.shape != (strategy.popsize,) or not validation.real_dtype(values.dtype):
        raise ValueError(
            f"es.tell: fitness must be a real array of shape ({strategy.popsize},) (one value per member, in "
            f"member order), got {values.dtype}{list(values.shape)}."
        )
    return values


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
