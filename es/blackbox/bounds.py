"""Box bounds for ``es.minimize(bounds=(lower, upper))``: ``fun`` is only ever called inside the box.

The search runs unbounded, on a *genotype* ``x``; ``fun`` sees its *phenotype*, a point of the box. Two
methods, as pycma's boundary handlers (``BoundPenalty``, and ``BoundTransform``, pycma's default):

- ``"penalty"`` (the default; Hansen, Niederberger, Guzzella & Koumoutsakos 2009, "A method for handling
  uncertainty in evolutionary optimization ...", IEEE TEC, its boundary handling): ``fun`` sees ``x``
  clipped into the box and the strategy ranks ``f + sum_i gamma_i (x_i - clip(x)_i)^2 / n``; the weights
  ``gamma`` start at twice the median of the recent inter-quartile ranges of ``f`` (divided by the mean
  variance) once the mean leaves the box, and grow on coordinates where the mean lies more than ``3 max(1,
  sqrt(n) / mu_eff)`` standard deviations outside (``penalty_update``). Inside the box ``fun`` is ranked
  as it is.
- ``"transform"`` (pycma's ``BoxConstraintsLinQuadTransformation``): per coordinate a periodic C1 map of R
  onto ``[l, u]``, the identity on ``[l + a_l, u - a_u]`` (about 90% of the interval) and quadratic at its
  ends, with ``a_l = min((u - l) / 2, 0.05 max(|l|, 1))`` (``a_u`` alike; 1 for an open side). ``x`` is
  first shifted by whole periods ``r = 2 (u - l + a_l + a_u)`` into one period and mirrored into ``[l - a_l,
  u + a_u]``, then::

      y = l + (x - l + a_l)^2 / (4 a_l)   for x < l + a_l
      y = x                               for l + a_l <= x <= u - a_u
      y = u - (x - u - a_u)^2 / (4 a_u)   for x > u - a_u

  The search starts from the preimage of ``x0``. The map repeats ``fun``'s landscape around the box, its
  local optima with it.

With either, each run of CMA-ES or sep-CMA-ES starts with no sampling standard deviation above a third of its
coordinate's width (``into_limits``, pycma's ``maxstd``; pycma also applies it after every tell, es not).

The default is the penalty by measurement on COCO's bbob-boxed suite (the 24 functions, instances 1-3,
budget 1e4 D, the same seeds): it solved 0.35, 1.74 and 3.79 percentage points more of COCO's targets than
the map at D = 2, 5 and 10 (docs/benchmarks.md, ``experiments/bench/coco_bounds.py``).
"""

from __future__ import annotations

import functools
import statistics
import warnings
from typing import Any, NamedTuple

import jax
import numpy as np

from es.strategies.cma_es import eigenvalue_floor

METHODS = ("transform", "penalty")


class Box(NamedTuple):
    """Bounds on the flat (``ravel_pytree``) coordinates: ``lower``, ``upper`` float64[n] (-inf / inf: open),
    and the ``method`` (module docstring). ``es.minimize(bounds=es.blackbox.Box(l, u, "transform"))`` chooses
    pycma's default map instead of the penalty."""

    lower: Any
    upper: Any
    method: str = "penalty"


def checked(bounds, x0_flat: np.ndarray, spread) -> Box | None:
    """``bounds`` as a ``Box`` of flat float64 arrays, or a clear error naming what is wrong. ``bounds`` is
    ``(lower, upper)`` (each a scalar, an array shaped like ``x0``, or a pytree like it), a
    ``scipy.optimize.Bounds`` or a ``Box``; ``spread(value, name)`` turns one side into a flat float[n]."""
    if bounds is None:
        return None
    method = Box._field_defaults["method"]
    if isinstance(bounds, Box):
        lower, upper, method = bounds
        if method not in METHODS:
            raise ValueError(f"es.minimize(bounds=Box(..., method={method!r})): method must be one of {METHODS}.")
    elif hasattr(bounds, "lb") and hasattr(bounds, "ub"):  # scipy.optimize.Bounds
        lower, upper = bounds.lb, bounds.ub
    elif isinstance(bounds, list) and len(bounds) == x0_flat.size and all(
            isinstance(pair, tuple) and len(pair) == 2 for pair in bounds):
        raise ValueError(  # with 2 coordinates it would read as (lower, upper): a box other than the one meant
            f"es.minimize(bounds={bounds!r}): a list of (low, high) pairs, one per coordinate, is "
            "scipy.optimize.minimize's form; es.minimize takes bounds=(lower, upper): pass "
            "tuple(np.array(side) for side in zip(*pairs)), or scipy.optimize.Bounds(lower, upper)."
        )
    elif isinstance(bounds, (tuple, list)) and len(bounds) == 2:
        lower, upper = bounds
    else:
        raise TypeError(
            f"es.minimize(bounds={bounds!r}): bounds must be (lower, upper), each a number or an array shaped like "
            "x0 (-np.inf / np.inf for an open side), or a scipy.optimize.Bounds."
        )
    lower = np.asarray(spread(-np.inf if lower is None else lower, "lower"), np.float64)
    upper = np.asarray(spread(np.inf if upper is None else upper, "upper"), np.float64)
    for name, side in (("lower", lower), ("upper", upper)):
        if np.any(np.isnan(side)):
            raise ValueError(f"es.minimize(bounds=...): {name} holds NaN; use -np.inf / np.inf for an open side.")
    wrong = np.flatnonzero(~(lower < upper))
    if wrong.size:
        i = int(wrong[0])
        raise ValueError(
            f"es.minimize(bounds=...): lower must be below upper on every coordinate, but at flat index {i} "
            f"lower = {float(lower[i])!r} >= upper = {float(upper[i])!r}; swap them, or leave a fixed coordinate out of x."
        )
    outside = np.flatnonzero((x0_flat < lower) | (x0_flat > upper))
    if outside.size:
        i = int(outside[0])
        raise ValueError(
            f"es.minimize(x0=..., bounds=...): x0 is outside the box at flat index {i}: x0 = {float(x0_flat[i])!r} not in "
            f"[{float(lower[i])!r}, {float(upper[i])!r}] ({outside.size} coordinate(s) outside); start from a point inside, "
            "e.g. np.clip(x0, lower, upper)."
        )
    return Box(lower, upper, method)


MAXSTD_BOUNDRANGE = 1 / 3
"""The largest sampling standard deviation of a bounded coordinate, as a fraction of its width: pycma's
``maxstd_boundrange`` (its ``maxstd`` option, set from the bounds unless given)."""


LIMIT_TOLERANCE = 1e-6
"""A standard deviation over its limit by less than this relative amount is left as it is: one that was just set to
its limit may round above it, and a limited state is then limited (``into_limits`` returns ``None``)."""


def max_stds(box: Box) -> np.ndarray:
    """float64[n]: ``MAXSTD_BOUNDRANGE`` times each coordinate's width (``inf`` where a side is open)."""
    width = box.upper - box.lower
    return np.where(np.isfinite(width), width * MAXSTD_BOUNDRANGE, np.inf)


def into_limits(box: Box, state):
    """``state`` (an ``es.State`` of ``es.CMAES`` or ``es.SepCMAES``) with no coordinate's sampling standard
    deviation ``sigma A_i sqrt(C_ii)`` above ``max_stds(box)``, as pycma's ``_stds_into_limits``: with ``s_i =
    min(1, max_std_i / std_i)`` and ``s_max = max_i s_i``, ``sigma <- s_max sigma``, ``C <- S C S / s_max^2`` and
    ``p_c <- S p_c / s_max`` (``S = diag(s)``), ``B`` and ``d`` again from ``C`` (floored as
    ``es.strategies.cma_es.eigen`` floors them): the standard deviations of pycma's ``sigma_vec``, and ``C``
    keeps its scale. ``None`` where no coordinate is over its limit (the state stays as it is, bit for bit) or
    the strategy keeps no covariance.

    ``es.minimize`` applies it to each run's first state: a ``sigma0`` many times the box's width then starts
    at a third of it, where the members would otherwise land on the box's faces. pycma applies it after every
    tell too; es does not (docs/benchmarks.md: on COCO's bbob-boxed no better, and a check per generation
    cost 13% of a generation's time)."""
    inner = state.strategy_state
    if getattr(inner, "cov", None) is None:
        return None
    limit = max_stds(box)
    lowest = float(np.min(limit))
    full = np.ndim(inner.cov) == 2  # one transfer: sigma, A, and d (C's diagonal for sep-CMA-ES)
    sigma, spread, scaling = jax.device_get((inner.sigma, inner.scales if full else inner.cov, inner.scaling))
    sigma = float(sigma) * (1.0 if scaling is None else np.asarray(scaling, np.float64))
    largest = float(np.max(sigma)) * float(np.max(spread) if full else np.sqrt(np.max(spread)))
    if (2 if full else 1) * largest <= lowest:  # the fast way out, from n + 2 floats: a start inside the box
        return None  # (full: C_ii <= the largest eigenvalue d^2; x2, as d may be a few generations old)
    cov = np.asarray(inner.cov if full else spread, np.float64)
    stds = sigma * np.sqrt(np.diagonal(cov) if full else cov)
    with np.errstate(divide="ignore", invalid="ignore"):
        shrink = np.where(stds > limit * (1 + LIMIT_TOLERANCE), limit / stds, 1.0)
    if np.all(shrink == 1.0):
        return None
    # The factor every coordinate shares (the largest, 1 unless all are over) goes into sigma, the rest into C:
    # C keeps its scale, however many times the box sigma was (C would underflow, tolupsigma misread sigma).
    common = float(np.max(shrink))
    shrink = shrink / common
    put = functools.partial(_on_device, dtype=inner.sigma.dtype)
    inner = inner._replace(sigma=put(np.asarray(inner.sigma, np.float64) * common),
                           path_cov=put(shrink * np.asarray(inner.path_cov, np.float64)))
    if not full:
        return state._replace(strategy_state=inner._replace(cov=put(cov * shrink**2)))
    cov = cov * shrink[:, None] * shrink[None, :]
    values, vectors = np.linalg.eigh(cov)
    floor = eigenvalue_floor(inner.sigma.dtype)
    return state._replace(strategy_state=inner._replace(
        cov=put(cov), basis=put(vectors), scales=put(np.sqrt(np.maximum(values, floor)))))


def _on_device(value: np.ndarray, dtype):
    """``value`` on the default device as ``dtype`` (a transfer; ``jnp.asarray`` would compile a program)."""
    return jax.device_put(np.asarray(value, dtype))


def warn_if_wider(box: Box, sigma0: float) -> None:
    """A ``UserWarning`` where ``sigma0`` exceeds the box's width on a bounded coordinate, for a strategy
    without a covariance (CMA-ES's first standard deviations are limited: ``into_limits``): most members then
    fall outside the box, onto its faces, and the search starts slowly."""
    width = box.upper - box.lower
    wide = np.flatnonzero(np.isfinite(width) & (sigma0 > width))
    if wide.size:
        i = int(wide[0])
        warnings.warn(
            f"es.minimize(sigma0={sigma0!r}): larger than the box's width {float(width[i])!r} at flat index {i} "
            f"({wide.size} coordinate(s)); most members fall outside the box and the search starts slowly. Use "
            f"about a quarter of the width (sigma0={float(width[i]) / 4:.3g}), or rescale the coordinates to alike "
            "widths.", UserWarning, stacklevel=3)


def _widths(box: Box) -> tuple[np.ndarray, np.ndarray]:
    """``(a_l, a_u)``: the lengths of the quadratic ends (1 on an open side)."""
    lower, upper = box.lower, box.upper
    half = (upper - lower) / 2
    with np.errstate(invalid="ignore"):
        a_l = np.where(np.isfinite(lower), np.minimum(half, 0.05 * np.maximum(np.abs(lower), 1.0)), 1.0)
        a_u = np.where(np.isfinite(upper), np.minimum(half, 0.05 * np.maximum(np.abs(upper), 1.0)), 1.0)
    return a_l, a_u


def transform(box: Box, x: np.ndarray) -> np.ndarray:
    """The phenotype of genotypes ``x`` (float64[..., n]): in ``[lower, upper]`` on every coordinate."""
    lower, upper = box.lower, box.upper
    if box.method == "penalty":
        return np.clip(x, lower, upper)
    a_l, a_u = _widths(box)
    both = np.isfinite(lower) & np.isfinite(upper)
    with np.errstate(invalid="ignore", over="ignore"):
        period = np.where(both, 2 * (upper - lower + a_l + a_u), 1.0)
        start = np.where(both, lower - 2 * a_l - (upper - lower) / 2, 0.0)
        x = np.where(both, x - period * np.floor((x - start) / period), x)
        x = np.where(np.isfinite(upper) & (x > upper + a_u), 2 * (upper + a_u) - x, x)
        x = np.where(np.isfinite(lower) & (x < lower - a_l), 2 * (lower - a_l) - x, x)
        y = np.where(x < lower + a_l, lower + (x - lower + a_l) ** 2 / (4 * a_l), x)
        y = np.where(x > upper - a_u, upper - (x - upper - a_u) ** 2 / (4 * a_u), y)
    return np.clip(y, lower, upper)  # the identity on every value above; guards rounding far from the box


def inverse(box: Box, y: np.ndarray) -> np.ndarray:
    """A genotype whose phenotype is ``y`` (a point of the box): the preimage in ``[l - a_l, u + a_u]``."""
    if box.method == "penalty":
        return np.asarray(y, np.float64)
    lower, upper = box.lower, box.upper
    a_l, a_u = _widths(box)
    with np.errstate(invalid="ignore"):
        x = np.where(y < lower + a_l, lower - a_l + 2 * np.sqrt(np.maximum(a_l * (y - lower), 0.0)), y)
        return np.where(y > upper - a_u, upper + a_u - 2 * np.sqrt(np.maximum(a_u * (upper - y), 0.0)), x)


# --------------------------------------------------------------------------- the penalty method


class Penalty(NamedTuple):
    """The penalty method's state: ``gamma`` (float[n], or ``None`` before the mean first left the box) and
    ``history``, the recent normalised inter-quartile ranges of ``f`` (newest first)."""

    gamma: np.ndarray | None = None
    history: tuple[float, ...] = ()


def penalties(box: Box, state: Penalty, x: np.ndarray) -> np.ndarray:
    """float[P]: ``sum_i gamma_i (x_i - clip(x)_i)^2 / n`` of genotypes ``x`` (float[P, n]); 0 before ``gamma``."""
    if state.gamma is None:
        return np.zeros(x.shape[0])
    return np.sum(state.gamma * (x - np.clip(x, box.lower, box.upper)) ** 2, axis=1) / x.shape[1]


def penalty_update(box: Box, state: Penalty, f: np.ndarray, x: np.ndarray, mean: np.ndarray,
                   mu_eff: float) -> Penalty:
    """The weights after a generation: ``f`` its values (float[P], unpenalised), ``x`` its genotypes
    (float[P, n]), ``mean`` the distribution's mean; the variances are the members' own."""
    n, popsize = x.shape[1], x.shape[0]
    variances = np.maximum(np.var(x, axis=0), np.finfo(np.float64).tiny)
    values = np.sort(f[np.isfinite(f)])
    history = state.history
    if values.size:
        count = 1 + values.size
        spread = (values[min(3 * count // 4, values.size - 1)] - values[count // 4]) / np.mean(variances)
        if np.isfinite(spread) and spread > 0:
            history = (float(spread),) + history
    history = history[:int(20 + 3 * n / popsize)]
    outside = (mean - np.clip(mean, box.lower, box.upper)) / np.sqrt(variances)
    if not history:
        return Penalty(state.gamma, history)
    typical = float(statistics.median(history))  # np.median's value (the mean of the middle two), a tenth of its time
    damping = min(1.0, mu_eff / 10 / n)
    gamma = state.gamma
    if gamma is None:
        if not np.any(outside):
            return Penalty(None, history)
        gamma = np.full(n, 2 * typical)
    far = np.abs(outside) - 3 * max(1.0, np.sqrt(n) / mu_eff)
    gamma = gamma * np.exp((far > 0) * np.tanh(far / 3) / 2) ** damping
    gamma = np.where(gamma > 5 * typical, gamma * np.exp(-1 / 3) ** damping, gamma)
    return Penalty(gamma, history)
