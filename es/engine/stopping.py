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

MAX_HISTORY = 2000
"""Generations the history keeps at most (stagnation looks back at most this far)."""


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
      tolstagnation: generations over which neither the best nor the median
        fitness improved; ``None``: ``100 + 100 D**1.5 / popsize`` (at most
        ``MAX_HISTORY``).
    """

    tolfun: float = 1e-11
    tolfunhist: float = 1e-12
    tolx: float = 1e-11
    tolupsigma: float = 1e20
    conditioncov: float = 1e14
    tolstagnation: int | None = None

    def recent(self, dim: int, popsize: int) -> int:
        """``k``: the generations of ``tolfun``'s and ``tolfunhist``'s window."""
        return min(10 + math.ceil(30 * dim / popsize), MAX_HISTORY)

    def stagnation(self, dim: int, popsize: int) -> int:
        """The generations of the stagnation window."""
        length = self.tolstagnation if self.tolstagnation is not None else int(100 + 100 * dim**1.5 / popsize)
        return min(length, MAX_HISTORY)


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
    "stagnation": "neither the best nor the median fitness improved over the last {stagnation} generations",
    "collapsed": "the scale no longer changes the params (it is 0, or below the mean's floating-point resolution)",
}


class History(NamedTuple):
    """The recent generations' fitnesses, newest first (entry ``k`` is ``k`` generations old), higher is better.

    Attributes:
      best: float[length], each generation's best fitness (negated when minimising).
      best_residual: float[length], what ``best`` dropped of a value with more
        precision than the fitness dtype (``es.fitness.Fitnesses.residual``).
      median: float[length], each generation's median valid fitness.
      count: int32, the generations recorded (those with a valid member).
      last: float[popsize], the last generation's fitnesses as the strategy
        ranked them (shifted by a constant: only their differences count).
    """

    best: jax.Array
    best_residual: jax.Array
    median: jax.Array
    count: jax.Array
    last: jax.Array


def history_length(dim: int, popsize: int) -> int:
    """Entries of the history for ``dim`` params and ``popsize`` members: the longer default window, capped."""
    criteria = StopCriteria()
    return max(criteria.recent(dim, popsize), criteria.stagnation(dim, popsize)) + 1


def initial_history(dim: int, popsize: int, dtype) -> History:
    zeros = jnp.zeros((history_length(dim, popsize),), dtype)
    return History(zeros, zeros, zeros, jnp.zeros((), jnp.int32), jnp.full((popsize,), jnp.nan, dtype))


def record(history: History, maximize: bool, values, residual, ranked, valid) -> History:
    """``history`` with this generation added in front (unchanged when no member is valid)."""
    sign = 1.0 if maximize else -1.0
    better = jnp.where(valid, sign * ranked, -jnp.inf)
    best = jnp.argmax(better)
    median = sign * jnp.nanmedian(jnp.where(valid, values, jnp.nan))
    entry = (sign * values[best], sign * (0.0 if residual is None else residual[best]), median)
    any_valid = jnp.any(valid)
    updated = [jnp.where(any_valid, jnp.concatenate([jnp.asarray(new, buffer.dtype)[None], buffer[:-1]]), buffer)
               for buffer, new in zip(history[:3], entry)]
    return History(*updated, history.count + any_valid.astype(jnp.int32), ranked.astype(history.last.dtype))


def _recent_range(history: History, window: int) -> jax.Array:
    """The span of the best fitness over the last ``min(count, window)`` generations, at full precision."""
    best, residual = history.best[:window], history.best_residual[:window]
    inside = jnp.arange(best.shape[0]) < history.count
    relative = (best - best[0]) + (residual - residual[0])
    return jnp.max(jnp.where(inside, relative, -jnp.inf)) - jnp.min(jnp.where(inside, relative, jnp.inf))


def _stagnated(history: History, window: int) -> jax.Array:
    """pycma's stagnation: over the last ``window`` generations, the median of the newest 20% of the best
    (and of the median) fitnesses is no better than the median of the oldest 20% (one sort of the four)."""
    part = max(1, math.ceil(0.2 * window))
    slices = jnp.stack([buffer[start:start + part] for buffer in (history.best, history.median)
                        for start in (0, window - part)])
    newest_best, oldest_best, newest_median, oldest_median = jnp.median(slices, axis=1)
    return (history.count >= max(window, 100)) & (newest_best <= oldest_best) & (newest_median <= oldest_median)


def coordinate_scale(scale: jax.Array) -> jax.Array:
    """Each coordinate's standard deviation from a strategy's ``scale``: itself, or a matrix's row norms."""
    if jnp.ndim(scale) == 2:
        return jnp.sqrt(jnp.sum(scale * scale, axis=1))
    return scale


def state_conditions(strategy, hp, state, criteria: StopCriteria) -> dict[str, jax.Array]:
    """Every condition met (name -> bool scalar) by an ``es.State``: the shared ones and the strategy's.

    ``strategy`` is the strategy (or its ``program()``), ``hp`` its
    hyperparameters. Read after a generation: the history holds it, and the
    scale is the one the next generation would sample with.
    """
    flat = ravel_pytree(state.params)[0]
    mean = flat.astype(jnp.promote_types(flat.dtype, jnp.float32))
    scale = strategy.scale(hp, state.strategy_state, state.generation)
    history = state.stop_history
    last = history.last
    valid = jnp.isfinite(last)
    spread_ = jnp.max(jnp.where(valid, last, -jnp.inf)) - jnp.min(jnp.where(valid, last, jnp.inf))
    return conditions(strategy, hp, state.strategy_state, mean, scale, history, state.generation, spread_, criteria)


def conditions(strategy, hp, strategy_state, mean, scale, history: History, generation, spread,
               criteria: StopCriteria) -> dict[str, jax.Array]:
    """Every condition met (name -> bool scalar): the shared ones and the strategy's.

    ``mean`` is the flat mean, ``scale`` the strategy's scale, ``spread`` the
    span of the last generation's valid fitnesses (full precision).
    """
    dim, popsize = mean.shape[0], strategy.popsize
    recent = criteria.recent(dim, popsize)
    history_range = _recent_range(history, recent)
    std = coordinate_scale(scale)
    found = {
        "tolfun": (history.count > 0) & (spread < criteria.tolfun) & (history_range < criteria.tolfun),
        "tolfunhist": (history.count > 9) & (history_range < criteria.tolfunhist),
        "stagnation": _stagnated(history, criteria.stagnation(dim, popsize)),
        "collapsed": jnp.all(mean + 0.1 * std == mean),
    }
    found.update(strategy.stop_conditions(hp, strategy_state, mean, generation, criteria))
    unknown = set(found) - set(CRITERIA)
    if unknown:
        raise ValueError(f"{type(strategy).__name__}.stop_conditions: unknown conditions {sorted(unknown)}; "
                         f"use names of es.engine.stopping.CRITERIA {list(CRITERIA)}.")
    return found


def bitmask(found: dict[str, jax.Array]) -> jax.Array:
    """int32: bit ``i`` set when ``CRITERIA[i]`` is met."""
    bits = [jnp.where(found[name], 1 << i, 0) for i, name in enumerate(CRITERIA) if name in found]
    return jnp.sum(jnp.stack(bits)).astype(jnp.int32) if bits else jnp.zeros((), jnp.int32)


def reasons(mask: int, dim: int, popsize: int, criteria: StopCriteria = StopCriteria()) -> list[str]:
    """The conditions of a ``"stop"`` bitmask, each as ``"name: what it means"``."""
    mask = int(np.asarray(mask))
    numbers = {**criteria._asdict(), "recent": criteria.recent(dim, popsize),
               "stagnation": criteria.stagnation(dim, popsize)}
    return [f"{name}: {DESCRIPTIONS[name].format(**numbers)}" for i, name in enumerate(CRITERIA) if mask >> i & 1]
