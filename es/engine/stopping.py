"""When a run should stop, and why: pycma's termination criteria, checked after every generation.

Every strategy shares the criteria that read the fitness history and the scale; a strategy adds its own
(``Strategy.stop_conditions``: CMA-ES's ``tolx``, ``conditioncov``, ...). The state keeps what they need:
``History``, ring buffers of each generation's best and median fitness (``es.State.stop_history``). After
each generation the engine reports the conditions met as the metric ``"stop"``, an int32 bitmask over
``CRITERIA``; ``es.stop_reasons(strategy, state)`` says them in words after an ``es.tell`` or
``es.evolve``.

Stopping never changes what a generation does: a state that meets a condition runs further generations
as any other (the conditions stay reported). ``es.minimize`` ends a run, or restarts it, when one is met.

Defaults and definitions follow pycma (``cma.CMAOptions``; Hansen's tutorial, arXiv:1604.00772, appendix B).
``k = 10 + ceil(30 D / popsize)`` generations make the "recent" window of ``tolfun`` and ``tolfunhist``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

CRITERIA = ("tolfun", "tolfunhist", "tolx", "tolupsigma", "noeffectaxis", "noeffectcoord", "conditioncov",
            "stagnation", "collapsed")
"""Every stopping condition, in the bit order of the ``"stop"`` metric (``tolfun`` is bit 0)."""

SPARSE_EVERY = 5
"""Stagnation reads every ``SPARSE_EVERY``-th generation's best and median fitness, as pycma does."""

MAX_SPARSE = 2000
"""Entries of the sparse history at most (``SPARSE_EVERY * MAX_SPARSE`` generations; pycma keeps 20,000)."""


class StopCriteria(NamedTuple):
    """The thresholds of the stopping conditions (pycma's defaults). Static: a new value recompiles.

    Attributes:
      tolfun: the fitnesses of this generation, and the best fitness of each
        of the last ``k`` generations, span less than this.
      tolfunhist: the best fitness of each of the last ``k`` generations spans
        less than this (after 10 generations).
      tolx: every coordinate's standard deviation (and evolution path) times
        sigma is below this.
      tolupsigma: sigma grew by more than this times its initial value over
        the largest principal axis (a diverging search).
      conditioncov: the covariance's condition number exceeds this.
      tolstagnation: ``T``, the stagnation period in generations; ``None``:
        ``100 + 100 D**1.5 / popsize``. pycma's test (``_stagnated``).
    """

    tolfun: float = 1e-11
    tolfunhist: float = 1e-12
    tolx: float = 1e-11
    tolupsigma: float = 1e20
    conditioncov: float = 1e14
    tolstagnation: int | None = None

    def recent(self, dim: int, popsize: int) -> int:
        """``k``: the generations of ``tolfun``'s and ``tolfunhist``'s window."""
        return 10 + math.ceil(30 * dim / popsize)

    def stagnation(self, dim: int, popsize: int) -> int:
        """``T``: the stagnation period in generations."""
        return self.tolstagnation if self.tolstagnation is not None else int(100 + 100 * dim**1.5 / popsize)


DESCRIPTIONS = {
    "tolfun": "the fitnesses of the last generation, and the best fitness of each of the last {recent} "
              "generations, lie within tolfun={tolfun:g} of each other",
    "tolfunhist": "the best fitness of each of the last {recent} generations lies within tolfunhist={tolfunhist:g}",
    "tolx": "every coordinate's scale (and evolution path) is below tolx={tolx:g}",
    "tolupsigma": "sigma grew by more than tolupsigma={tolupsigma:g} times its initial value over the largest "
                  "principal axis: the search diverges (is the objective bounded and well scaled?)",
    "noeffectaxis": "a step of 0.1 sigma along a principal axis no longer changes the mean",
    "noeffectcoord": "a step of 0.2 sigma along some coordinate no longer changes the mean",
    "conditioncov": "the covariance's condition number exceeds conditioncov={conditioncov:g}",
    "stagnation": "the best fitness is more than {half_stagnation} generations old, and the median of the "
                  "recent generations' best and median fitness is no better than the median of the ones before "
                  "(tolstagnation={stagnation})",
    "collapsed": "the scale no longer changes the params (it is 0, or below the mean's floating-point resolution)",
}


class OnTheState(NamedTuple):
    """Only the conditions that read the state, with ``criteria``'s thresholds: the program records no fitness
    history and leaves ``tolfun``, ``tolfunhist`` and ``stagnation`` to its caller, which keeps the history on
    the host (es.minimize's loop: ``es.engine.fitness_history``)."""

    criteria: StopCriteria


class History(NamedTuple):
    """The fitnesses the stopping conditions read, newest first, higher is better (negated when minimising).

    Attributes:
      best: float[k + 1], each recent generation's best fitness (entry ``j``
        is ``j`` generations old; ``k`` as in ``StopCriteria.recent``).
      best_residual: float[k + 1], what ``best`` dropped of a value with more
        precision than the fitness dtype (``es.fitness.Fitnesses.residual``).
      sparse_best: float[MAX_SPARSE], the best fitness of every
        ``SPARSE_EVERY``-th generation (pycma's ``histbest``).
      sparse_median: float[MAX_SPARSE], the median valid fitness of the same
        generations (pycma's ``histmedian``).
      count: int32, the generations recorded (those with a valid member).
      record: the best fitness so far (full precision: ``record`` plus
        ``record_residual``), and ``since_record``, int32, the generations
        since it improved.
      last: float[popsize], the last generation's fitnesses as the strategy
        ranked them (shifted by a constant: only their differences count).
    """

    best: jax.Array
    best_residual: jax.Array
    sparse_best: jax.Array
    sparse_median: jax.Array
    count: jax.Array
    record: jax.Array
    record_residual: jax.Array
    since_record: jax.Array
    last: jax.Array


def initial_history(dim: int, popsize: int, dtype) -> History:
    # Built in numpy and put on the device: an eager jnp.zeros, and jnp.asarray of a numpy array too (jax 0.10's
    # `stage`), compile a program per shape, and the shapes follow the popsize, which each restart of
    # es.minimize changes.
    recent = jax.device_put(np.zeros((StopCriteria().recent(dim, popsize) + 1,), dtype))
    sparse = jax.device_put(np.zeros((MAX_SPARSE,), dtype))
    zero = jax.device_put(np.int32(0))
    return History(recent, recent, sparse, sparse, zero, jax.device_put(np.asarray(-np.inf, dtype)),
                   jax.device_put(np.zeros((), dtype)), zero, jax.device_put(np.full((popsize,), np.nan, dtype)))


def _pushed(buffer: jax.Array, new, when) -> jax.Array:
    """``buffer`` with ``new`` in front and its oldest entry dropped, where ``when``; else unchanged."""
    return jnp.where(when, jnp.concatenate([jnp.asarray(new, buffer.dtype)[None], buffer[:-1]]), buffer)


def record(history: History, maximize: bool, values, residual, ranked, valid) -> History:
    """``history`` with this generation added (unchanged when no member is valid)."""
    sign = 1.0 if maximize else -1.0
    index = jnp.argmax(jnp.where(valid, ranked if maximize else -ranked, -jnp.inf))  # as in update.track_best
    best, best_residual = sign * values[index], sign * (0.0 if residual is None else residual[index])
    median = sign * valid_median(values, valid)
    any_valid = jnp.any(valid)
    count = history.count + any_valid.astype(jnp.int32)
    sparse = any_valid & (count % SPARSE_EVERY == 0)
    improved = any_valid & ((best - history.record) + (best_residual - history.record_residual) > 0)
    return History(
        _pushed(history.best, best, any_valid),
        _pushed(history.best_residual, best_residual, any_valid),
        _pushed(history.sparse_best, best, sparse),
        _pushed(history.sparse_median, median, sparse),
        count,
        jnp.where(improved, jnp.asarray(best, history.record.dtype), history.record),
        jnp.where(improved, jnp.asarray(best_residual, history.record.dtype), history.record_residual),
        jnp.where(improved, 0, history.since_record + any_valid.astype(jnp.int32)),
        ranked.astype(history.last.dtype),
    )


def _recent_range(history: History, window: int) -> jax.Array:
    """The span of the best fitness over the last ``min(count, window)`` generations, at full precision."""
    best, residual = history.best[:window], history.best_residual[:window]
    inside = jnp.arange(best.shape[0]) < history.count
    relative = (best - best[0]) + (residual - residual[0])
    largest, smallest = extremes(relative, inside)
    return largest - smallest


def _stagnated(history: History, dim: int, popsize: int, period: int) -> jax.Array:
    """pycma's ``tolstagnation`` (cma 4.5, ``_CMAStopDict``) over the sparse history of ``n`` entries: after
    ``D (5 + 100 / popsize)`` generations and 100 entries, with the best fitness older than ``T / 2``
    generations, the medians of the newest ``l = max(T / 10, n / 10)`` entries of the best and of the median
    fitness are no better than those of the ``l`` entries before (``2 l < n``)."""
    entries = jnp.minimum(history.count // SPARSE_EVERY, MAX_SPARSE)
    length = jnp.maximum(period / 10, entries / 10).astype(jnp.int32)
    ready = ((history.count > dim * (5 + 100 / popsize)) & (history.since_record > period / 2) & (entries > 100)
             & (2 * length < entries))

    def none(_):
        return (jnp.zeros((), history.sparse_best.dtype),) * 4

    newest_best, before_best, newest_median, before_median = jax.lax.cond(
        ready, lambda _: window_medians(history, length), none, None)
    return ready & (newest_best <= before_best) & (newest_median <= before_median)


def window_medians(history: History, length: jax.Array) -> tuple[jax.Array, ...]:
    """The medians (numpy's) of the sparse best and median fitness over the newest ``length`` entries and the
    ``length`` before them: ``(newest best, before best, newest median, before median)``. Every entry of both
    windows must be recorded (``2 length <= n``)."""
    # One sort of each buffer by (window, value) puts the newest window's values in order at [0, length) and
    # the one before's at [length, 2 length); each median is the mean of its window's two middle entries.
    index = jnp.arange(MAX_SPARSE, dtype=jnp.int32)
    window = jnp.where(index < length, 0, jnp.where(index < 2 * length, 1, 2))
    low, high = (length - 1) // 2, length // 2

    def window_pair(buffer):
        ordered = jax.lax.sort((window, buffer), num_keys=2)[1]
        return tuple((ordered[start + low] + ordered[start + high]) / 2 for start in (0, length))

    return (*window_pair(history.sparse_best), *window_pair(history.sparse_median))


def valid_median(values: jax.Array, valid: jax.Array) -> jax.Array:
    """The median of the ``valid`` entries of ``values`` (``[n]``), NaN where none is valid: numpy's median
    (the mean of the two middle values), from one sort."""
    count = jnp.sum(valid, dtype=jnp.int32)
    ordered = jnp.sort(jnp.where(valid, values, jnp.inf))  # the valid values first
    # The two middle entries, each picked by a masked max (exactly its value): XLA's CPU compiler takes
    # longer over a gather (take_along_axis) in these programs than over the two reductions.
    position = jnp.arange(values.shape[0])
    low, high = (jnp.max(jnp.where(position == middle, ordered, -jnp.inf))
                 for middle in (jnp.maximum(count - 1, 0) // 2, count // 2))
    return jnp.where(count > 0, (low + high) / 2, jnp.nan)


def extremes(values: jax.Array, where: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(max, min)`` of ``values[where]`` (``-inf, inf`` where none is selected)."""
    return jnp.max(jnp.where(where, values, -jnp.inf)), jnp.min(jnp.where(where, values, jnp.inf))


def coordinate_scale(scale: jax.Array) -> jax.Array:
    """Each coordinate's standard deviation from a strategy's ``scale``: itself, or a matrix's row norms."""
    if jnp.ndim(scale) == 2:
        return jnp.sqrt(jnp.sum(scale * scale, axis=1))
    return scale


def state_conditions(strategy, hp, state, criteria: StopCriteria | OnTheState) -> dict[str, jax.Array]:
    """Every condition met (name -> bool scalar) by an ``es.State``: the shared ones and the strategy's
    (``OnTheState``: those that read the state alone).

    ``strategy`` is the strategy (or its ``program()``), ``hp`` its
    hyperparameters. Read after a generation: the history holds it, and the
    scale is the one the next generation would sample with.
    """
    flat = ravel_pytree(state.params)[0]
    mean = flat.astype(jnp.promote_types(flat.dtype, jnp.float32))
    scale = strategy.scale(hp, state.strategy_state, state.generation)
    history = None if isinstance(criteria, OnTheState) else state.stop_history
    return conditions(strategy, hp, state.strategy_state, mean, scale, history, state.generation, criteria)


def conditions(strategy, hp, strategy_state, mean, scale, history: History | None, generation,
               criteria: StopCriteria | OnTheState) -> dict[str, jax.Array]:
    """Every condition met (name -> bool scalar): the shared ones and the strategy's; those on the fitness
    ``history`` only where it is given (``None`` with ``OnTheState``).

    ``mean`` is the flat mean, ``scale`` the strategy's scale.
    """
    dim, popsize = mean.shape[0], strategy.popsize
    criteria = criteria.criteria if isinstance(criteria, OnTheState) else criteria
    found = {} if history is None else history_conditions(history, dim, popsize, criteria)
    found["collapsed"] = jnp.all(mean + 0.1 * coordinate_scale(scale) == mean)
    found.update(strategy.stop_conditions(hp, strategy_state, mean, generation, criteria))
    unknown = set(found) - set(CRITERIA)
    if unknown:
        raise ValueError(f"{type(strategy).__name__}.stop_conditions: unknown conditions {sorted(unknown)}; "
                         f"use names of es.engine.stopping.CRITERIA {list(CRITERIA)}.")
    return found


def history_conditions(history: History, dim: int, popsize: int, criteria: StopCriteria) -> dict[str, jax.Array]:
    """``tolfun``, ``tolfunhist`` and ``stagnation``: the conditions on the fitness history (its last
    generation's fitnesses at full precision, its recent best and its sparse best and median)."""
    largest, smallest = extremes(history.last, jnp.isfinite(history.last))
    spread = largest - smallest
    history_range = _recent_range(history, criteria.recent(dim, popsize))
    return {
        "tolfun": (history.count > 0) & (spread < criteria.tolfun) & (history_range < criteria.tolfun),
        "tolfunhist": (history.count > 9) & (history_range < criteria.tolfunhist),
        "stagnation": _stagnated(history, dim, popsize, criteria.stagnation(dim, popsize)),
    }


def bitmask(found: dict[str, jax.Array]) -> jax.Array:
    """int32: bit ``i`` set when ``CRITERIA[i]`` is met."""
    bits = [jnp.where(found[name], 1 << i, 0) for i, name in enumerate(CRITERIA) if name in found]
    return jnp.sum(jnp.stack(bits)).astype(jnp.int32) if bits else jnp.zeros((), jnp.int32)


def reasons(mask: int, dim: int, popsize: int, criteria: StopCriteria = StopCriteria()) -> list[str]:
    """The conditions of a ``"stop"`` bitmask, each as ``"name: what it means"``."""
    mask = int(np.asarray(mask))
    period = criteria.stagnation(dim, popsize)
    numbers = {**criteria._asdict(), "recent": criteria.recent(dim, popsize), "stagnation": period,
               "half_stagnation": period // 2}
    return [f"{name}: {DESCRIPTIONS[name].format(**numbers)}" for i, name in enumerate(CRITERIA) if mask >> i & 1]
