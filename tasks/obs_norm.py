"""Running observation statistics for observation normalisation (Salimans et al. 2017).

The statistics live in the ES state (``state.fitness_state``) and change only
between generations: during a generation every member normalises with the same
``(mean, std)`` and returns the statistics of the observations it saw,
``(count, mean, M2)`` per member (Welford's update, step by step). The engine
gathers them for the whole population (``popsize x (2 * obs_size + 1)``
floats) and every device folds them into the running statistics with
``merge``, one fixed-order reduction over members, so the statistics (and the
run) do not depend on the device count.

``merge`` is Chan et al.'s parallel combination of ``(count, mean, M2)``,
written as two vectorised passes (weighted mean, then squared deviations of
the member means), which stays accurate in float32 even when the mean is much
larger than the spread.

``std``, ``normalize`` and ``combine`` also take ``xp=numpy``, for policies
that run outside JAX (the gymnasium tasks' workers, ``tasks/gym.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

CLIP = 5.0  # normalised observations are clipped to [-CLIP, CLIP] (as in Salimans et al.)
MIN_STD = 1e-3  # features that never vary are divided by this instead of 0


class ObsStats(NamedTuple):
    """Statistics of a set of observations (with a leading axis: one set per member).

    Attributes:
      count: float32 scalar, number of observations.
      mean: float32[obs_size], their mean.
      m2: float32[obs_size], the sum of squared deviations from ``mean``.
    """

    count: jax.Array
    mean: jax.Array
    m2: jax.Array


def init(obs_size: int) -> ObsStats:
    """No observations yet: normalisation is the identity."""
    zeros = jnp.zeros((obs_size,), jnp.float32)
    return ObsStats(jnp.zeros((), jnp.float32), zeros, zeros)


def std(stats: ObsStats, xp=jnp) -> jax.Array:
    """float32[obs_size]: the standard deviation (1 until two observations were seen)."""
    var = stats.m2 / xp.maximum(stats.count, 1.0)
    return xp.where(stats.count > 1, xp.maximum(xp.sqrt(var), MIN_STD), 1.0)


def normalize(stats: ObsStats, obs: jax.Array, xp=jnp) -> jax.Array:
    """``clip((obs - mean) / std, -5, 5)`` for one flat observation."""
    return xp.clip((obs - stats.mean) / std(stats, xp), -CLIP, CLIP)


def add(stats: ObsStats, obs: jax.Array, weight: jax.Array) -> ObsStats:
    """Welford's update with one observation (counted when ``weight`` is 1, ignored when 0)."""
    count = stats.count + weight
    delta = obs - stats.mean
    mean = stats.mean + weight * delta / jnp.maximum(count, 1.0)
    return ObsStats(count, mean, stats.m2 + weight * delta * (obs - mean))


def combine(stats: ObsStats, xp=jnp) -> ObsStats:
    """The statistics of the union of ``k`` sets (leading axis ``k``), reduced in a fixed order."""
    n = xp.sum(stats.count, axis=0)
    weights = stats.count / xp.maximum(n, 1.0)
    mean = xp.sum(weights[:, None] * stats.mean, axis=0)
    spread = xp.sum(stats.count[:, None] * (stats.mean - mean) ** 2, axis=0)
    return ObsStats(n, mean, xp.sum(stats.m2, axis=0) + spread)


def merge(stats: ObsStats, members: ObsStats) -> ObsStats:
    """Fold the population's per-member statistics (leading axis popsize, member order) into ``stats``.

    The inputs are the same on every device, and so is this computation.
    """
    both = jax.tree.map(lambda running, new: jnp.concatenate([running[None], new]), stats, members)
    return combine(both)
