"""Noisy objectives, ``es.minimize(noisy=True)``: uncertainty handling after Hansen, Niederberger, Guzzella &
Koumoutsakos, "A method for handling uncertainty in evolutionary optimization with an application to
feedback control of combustion" (IEEE TEC 13(1), 2009), with the settings of pycma's ``NoiseHandler``
(``cma.fmin2(..., noise_handler=True)``).

**Measuring the noise.** Each generation, ``lambda_r = 2 + lambda / 20`` members (stochastically rounded:
the first ``lambda_r - lambda_r // 2`` in member order, a random choice, and the best of the others) are
evaluated again. The ``2 lambda`` values, first and second evaluations together, are ranked; for each
re-evaluated member with ranks ``r1``, ``r2``::

    s_i = |r1 - r2 - sign(r1 - r2)| - max(1, L_i)

where ``L_i`` is the mean of the ``theta = 0.5`` quantiles (25th percentile) of the rank distances from
``r1`` and from ``r2`` to every rank (the rank change that noise-free values would make by chance).
``s <- (1 - c_s) s + c_s mean_i s_i`` with ``c_s = 0.3``.

**Treating it.** While ``s > 0`` (the ranking is dominated by noise) sigma grows by ``alpha = 1 + 2 / (n +
10)`` after the update, so that the distribution's steps keep above the noise. The strategy ranks the
first values, as pycma does (ranking a re-evaluated member by the mean of its two values instead solved
fewer targets on bbob-noisy: f108 at D = 2, instances 1-6, 136 of 306 against 171).

**The result.** The best single value of a noisy function is mostly luck. Each run's final mean (as ``fun``
sees it) is evaluated ``FINAL_EVALUATIONS`` times, the evaluations reserved from the budget; ``result.x``
is the one with the best mean value, and ``result.fun`` that mean.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

CUMULATION = 0.3
THETA = 0.5
FINAL_EVALUATIONS = 10
"""Evaluations of each run's final mean, whose average picks ``result.x``."""


def estimate(values) -> float:
    """The mean of a point's evaluations (``FINAL_EVALUATIONS`` of them), leaving out those that marked it
    infeasible (NaN or inf, as for any member); inf if every one did, so that such a point ranks last and
    ``result.fun`` is never NaN."""
    values = np.asarray(values, np.float64)
    done = values[np.isfinite(values)]
    return float(np.mean(done)) if done.size else math.inf


class Noise(NamedTuple):
    """The cumulated noise measure ``s`` of one run (> 0: noise dominates the ranking)."""

    level: float = 0.0


def reevaluated(fitness: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The indices of the members to evaluate again, from the generation's first values ``fitness``."""
    popsize = fitness.size
    count = 2 + popsize / 20
    count = min(popsize, int(count) + int(count % 1 > rng.uniform()))
    first = count - count // 2
    rest = np.argsort(_finite(fitness[first:]), kind="stable")[:count - first] + first
    return np.concatenate([np.arange(first), rest]).astype(np.int64)


def measured(noise: Noise, first: np.ndarray, second: np.ndarray, index: np.ndarray) -> Noise:
    """The measure after a generation: ``first`` the values of every member, ``second`` those of the members
    ``index`` evaluated again (float[len(index)])."""
    popsize = first.size
    again = np.array(first, np.float64, copy=True)
    again[index] = second
    order = np.argsort(np.concatenate([_finite(first), _finite(again)]), kind="stable")
    ranks = np.empty(2 * popsize, np.int64)
    ranks[order] = np.arange(2 * popsize)
    r1, r2 = ranks[:popsize][index], ranks[popsize:][index]
    delta = r1 - r2 - np.sign(r1 - r2)
    centres = np.stack([r1 + 1 - (r1 > r2), r2 + 1 - (r2 > r1)])  # [2, k]
    s = np.abs(delta) - np.maximum(np.mean(chance_rank_change(centres, 2 * popsize), axis=0), 1.0)
    return Noise(noise.level + CUMULATION * (float(np.mean(s)) - noise.level))


def chance_rank_change(centres: np.ndarray, count: int) -> np.ndarray:
    """``L`` of each rank in ``centres``: the ``THETA * 50``-th percentile (Hazen's definition, numpy's
    ``method="hazen"``) of its distances to the ranks ``1 .. count - 1``. The same numbers as ``np.percentile``
    (the distances are integers and the interpolation weight a quarter or three quarters), without its
    per-call overhead, which was a fifth of a noisy generation's host time."""
    distances = np.sort(np.abs(np.arange(1, count) - centres[..., None]), axis=-1)
    size = count - 1
    position = min(max(size * THETA / 2 - 0.5, 0.0), size - 1.0)  # Hazen: n q + 1/2, counted from 1
    low = int(position)
    below, above = distances[..., low], distances[..., min(low + 1, size - 1)]
    return below + (above - below) * (position - low)


def sigma_factor(noise: Noise, dim: int) -> float:
    """What sigma is multiplied by after the generation: ``1 + 2 / (n + 10)`` while noise dominates, else 1."""
    return 1.0 + 2.0 / (dim + 10) if noise.level > 0 else 1.0


def _finite(values: np.ndarray) -> np.ndarray:
    """``values`` with NaN as +inf (failed members rank last)."""
    return np.where(np.isnan(values), np.inf, values)
