"""Constraints for ``es.minimize(constraints=g)``: ``g(x)`` returns values, and ``x`` is feasible where every
one is ``<= 0`` (pycma's convention). An augmented Lagrangian turns the problem into a changing unconstrained
one, after Atamna, Auger & Hansen, "Linearly convergent evolution strategies via augmented Lagrangian
constraint handling" (FOGA 2017, Algorithm 1), with the coefficient rules of pycma's default
``AugmentedLagrangian`` (what ``cma.fmin_con2`` runs). The strategy ranks::

    h(x) = f(x) + sum_i  lam_i g_i + mu_i g_i^2 / 2    where mu_i g_i >= -lam_i
                         -lam_i^2 / (2 mu_i)            elsewhere (g_i clipped at -lam_i / mu_i)

- **Start.** ``lam = mu = 0`` (``h = f``) until a generation has more than 10% of its members infeasible on
  constraint ``i``; then, with ``iqr`` the inter-quartile range over the generation,
  ``lam_i = iqr(f) / (n iqr(g_i))`` and ``mu_i = 2 iqr(f) / (5 n iqr(g_i))``, raised towards
  ``lam_i / max|g_i|`` (at most 20 times); coefficients are set so until they settle.
- **Each generation**, from ``g`` at the generation's best member by ``h`` (no extra evaluation):
  ``lam_i <- max(0, lam_i + mu_i g_i / 5)`` (where constraint ``i`` penalised someone); ``mu_i`` grows by
  ``chi^(1/4 (1 + e))`` when ``g_i > 0`` or more than 95% of the last ``5 + n`` such points were feasible yet
  penalised, and shrinks by ``chi^(-1/4 (1 - e))`` when fewer than 90% were feasible and ``g_i < 0``;
  ``chi = 2^(1 / (5 n))``, and ``e`` ramps up over runs of changes of one sign (longer than ``2 + m``).

The coefficients carry over from one restart to the next, as pycma's ``fmin_con2`` keeps them. A member
whose ``g`` holds NaN (``g`` undefined there) is invalid, as one whose ``f`` is NaN: its penalty is NaN, and
the starting spreads leave out members whose ``g`` is not finite.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

DAMPING = 5.0
"""``d_gamma``: ``lam`` moves by ``mu g / DAMPING`` per generation."""


class Lagrangian(NamedTuple):
    """The augmented Lagrangian's coefficients and what their update reads (numpy; ``None`` before set).

    Attributes:
      lam, mu: float[m], the multipliers and penalty factors.
      settled: bool[m], whose starting values are final.
      history: the recent ``g`` of each generation's best member (newest last), float[m] each.
      same: int[m], signed counts of ``mu``'s last changes of one sign.
      updates: updates made since the coefficients were first set.
    """

    lam: np.ndarray | None = None
    mu: np.ndarray | None = None
    settled: np.ndarray | None = None
    history: tuple = ()
    same: np.ndarray | None = None
    updates: int = 0


def checked_values(value, count: int | None, where: str) -> np.ndarray:
    """``g(x)`` as float64[m]: a number, a 1-D array or a list of numbers, ``count`` of them if known; else a
    ``TypeError``/``ValueError`` that says what ``g`` returned."""
    try:  # None would be NaN (a member every g rejects): refused as what it is, a g that returned nothing
        array = None if value is None else np.asarray(value, np.float64)
    except (TypeError, ValueError):
        array = None
    if array is None or array.ndim > 1:
        got = f"an array of shape {array.shape}" if array is not None else repr(value)
        raise TypeError(
            f"es.minimize(constraints=g): g(x) must return a number or a 1-D array of numbers (or a list of "
            f"numbers), feasible where every value is <= 0; {where} it returned {got}."
        )
    array = array.ravel()
    if count is not None and array.size != count:
        raise ValueError(
            f"es.minimize(constraints=g): g(x) returned {array.size} values {where}, but {count} before; "
            "return the same number of constraint values for every x."
        )
    if array.size == 0:
        raise ValueError("es.minimize(constraints=g): g(x) returned no values; return at least one.")
    return array


def violations(g: np.ndarray) -> np.ndarray:
    """The largest violation of each row of ``g`` (float[..., m]): ``max(0, max_i g_i)``; inf where NaN."""
    worst = np.max(g, axis=-1)
    return np.where(np.isnan(worst), np.inf, np.maximum(worst, 0.0))


def penalties(al: Lagrangian, g: np.ndarray) -> np.ndarray:
    """float[P]: ``h - f`` of members whose constraint values are ``g`` (float[P, m]); 0 before any start.
    NaN for a member whose ``g`` holds NaN: it cannot be ranked, so the strategy counts it invalid, as it
    does a member whose ``f`` is NaN."""
    undefined = np.any(np.isnan(g), axis=1)
    if al.lam is None:
        return np.where(undefined, np.nan, 0.0)
    lam, mu = al.lam, al.mu
    with np.errstate(divide="ignore", invalid="ignore"):
        clipped = np.where(mu * g < -lam, -lam / np.where(mu > 0, mu, 1.0), g)
        return np.where(undefined, np.nan, np.sum(lam * clipped + 0.5 * mu * clipped**2, axis=1))


def penalised(al: Lagrangian, g: np.ndarray) -> np.ndarray:
    """bool[m]: whether constraint ``i`` penalised (``mu g > -lam``) any member of ``g`` (float[P, m])."""
    if al.lam is None:
        return np.zeros(g.shape[1], bool)
    return np.any(al.mu * g > -al.lam, axis=0)


def started(al: Lagrangian, f: np.ndarray, g: np.ndarray, dim: int) -> Lagrangian:
    """The coefficients set (or reset) from a generation's ``f`` (float[P]) and ``g`` (float[P, m]) where a
    constraint has more than 10% infeasible members and is not settled (module docstring). Members whose ``g``
    is not finite (undefined, or infinitely infeasible) are left out of the spreads."""
    if al.settled is not None and np.all(al.settled):
        return al
    if not np.all(np.isfinite(f)):
        return al
    finite = np.all(np.isfinite(g), axis=1)
    if np.sum(finite) < 2:
        return al
    f, g = f[finite], g[finite]
    m = g.shape[1]
    lam, mu, settled = (np.zeros(m), np.zeros(m), np.zeros(m, bool)) if al.lam is None else (
        al.lam.copy(), al.mu.copy(), al.settled.copy())
    sign = -1 + 2 * np.mean(g > 0, axis=0)
    chosen = (~settled | (mu == 0)) & (sign > -0.8)
    if np.any(chosen):
        spread_f = _iqr(f)
        spread_g, spread_g2 = _iqr(g), _iqr(g**2)
        new_mu = 2 / 5 * spread_f / dim / (spread_g + 1e-6 * spread_g2 + 1e-11 * (spread_f + 1))
        lam[chosen] = (spread_f / (dim * spread_g + 1e-11 * (spread_f + 1)))[chosen]
        lowered = chosen & (sign <= 0.2) & (mu > new_mu) & (mu > 0)
        lam[lowered] *= new_mu[lowered] / mu[lowered]
        mu[chosen] = new_mu[chosen]
        largest = np.max(np.abs(g), axis=0)
        mu[chosen] = np.minimum(20 * mu, np.maximum(mu, lam / (1e-22 + largest)))[chosen]
        settled[chosen & ((al.updates > 2 + dim) | (np.abs(sign) < 0.8))] = True
    return al._replace(lam=lam, mu=mu, settled=settled)


def updated(al: Lagrangian, g: np.ndarray, penalising: np.ndarray, dim: int) -> Lagrangian:
    """The coefficients after a generation whose best member by ``h`` has constraint values ``g`` (float[m]);
    ``penalising``: ``penalised`` of the generation."""
    history = (al.history + (g,))[-(dim + 20):]
    if al.lam is None:
        return al._replace(history=history)
    lam, mu = al.lam.copy(), al.mu.copy()
    same = np.zeros(lam.size, np.int64) if al.same is None else al.same.copy()
    recent = np.asarray(history[-(5 + dim):])
    feasible = np.mean((recent < 0) + 0.5 * (recent == 0), axis=0)
    chi = 2 ** (1 / (5 * dim))
    for i in range(lam.size):
        if mu[i] == 0:
            continue
        if g[i] * mu[i] > -lam[i] or penalising[i]:
            lam[i] += mu[i] * g[i] / DAMPING
        if lam[i] < 0:
            lam[i] = 0.0
            continue
        if g[i] * mu[i] < -lam[i]:  # inactive: leave mu
            continue
        if g[i] > 0 or feasible[i] > 0.95:
            same[i] = max(same[i], 0) + 1
            mu[i] *= chi ** (0.25 * (1 + _ramp(same[i], lam.size)))
        elif feasible[i] < 0.9 and g[i] < 0:
            same[i] = min(same[i], 0) - 1
            mu[i] *= chi ** (-0.25 * (1 - _ramp(same[i], lam.size)))
    return Lagrangian(lam, mu, al.settled, history, same, al.updates + 1)


def _ramp(count: int, m: int) -> float:
    """The extra exponent of a run of ``|count|`` changes of one sign: 0 for the first ``2 + m``, then rising
    linearly to ``4`` (signed as ``count``) over the next ``2 + m``."""
    wait = 2 + m
    beyond = abs(count) - wait
    return float(np.sign(count)) * 4 / wait * min(wait, max(beyond, 0))


def _iqr(values: np.ndarray) -> np.ndarray:
    """The inter-quartile range along the first axis."""
    upper, lower = np.percentile(values, [75, 25], axis=0)
    return upper - lower
