"""The margin of CMA-ES with margin (Hamano, Saito, Nomura & Shirakawa, "CMA-ES with Margin: Lower-Bounding
Marginal Probability for Mixed-Integer Black-Box Optimization", GECCO 2022): integer variables keep a
probability of at least ``alpha`` of taking another value than the one the mean rounds to, so the search
never freezes on a plateau of the rounding.

A member is ``x = m + sigma A (B D z)``: ``A`` is a diagonal scaling (``scaling``, one per coordinate, 1
where no margin acts) outside the adapted covariance; the update steps the mean by ``sigma A y_w`` and learns
``C`` from the unscaled ``y``. An integer coordinate ``j`` is read as ``clip(round(x_j), lo_j, hi_j)``: its
value cells are ``[k - 1/2, k + 1/2)``, the outermost reaching to -inf / +inf. After each update, with ``s
= sigma A_j sqrt(C_jj)`` its marginal standard deviation and ``p_low``, ``p_up`` the probabilities that
``x_j`` falls below / above the cell of ``m_j`` (thresholds ``l``, ``u``)::

    a cell with one neighbour (an edge):  if p < alpha:  m_j <- u - s z_(1 - alpha)   (or l + s z_(1 - alpha))
    a cell with two:  p'_low, p'_up = max(p_low, alpha / 2), max(p_up, alpha / 2), the excess taken from the
                      masses above alpha / 2 in proportion; then m_j and A_j solve
                      l = m_j - z_low s',  u = m_j + z_up s'  (z = Phi^-1(1 - p')),  A_j = s' / (sigma sqrt(C_jj))

The paper's ``alpha`` is ``1 / (n lambda)`` (``alpha=None``); ``es.minimize`` fixes it per coordinate
(``es.blackbox.integers.ALPHA``, measured on COCO's bbob-mixint). With no margin (``None``) a strategy's
state holds no ``scaling`` and its maths are unchanged, bit for bit.

Integer centering (``es.blackbox.integers.centered``, after Marty et al., PPSN 2024) changes the members the
update recombines: member ``i``'s ``y_i = (x_i - m) / (sigma A)`` becomes ``y_i + u_i``. The host, which holds
the members, writes what that adds to the update's sums into the state's ``centering`` (in ``y``), and the
update adds it to the sums it rebuilt (``centered_sums``: in ``z = (B D)^-1 y``) before anything reads them,
so the mean, both paths and ``C`` learn from the centred members, as pycma's do::

    linear = sum_i w_i u_i                                  (float[n])
    outer  = sum_i w_i (y_i u_i^T + u_i y_i^T + u_i u_i^T)  (float[n, n]; its diagonal for es.SepCMAES)

over the members of positive weight ``w_i``. The update leaves zeros there: a generation nobody centred adds
nothing.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.special import ndtr, ndtri

from es.strategies.base import filled


class IntegerMargin(NamedTuple):
    """Static configuration of the margin: which flat coordinates are integers, their integer bounds.

    Attributes:
      indices: flat (``ravel_pytree``) indices of the integer coordinates, sorted, distinct.
      lower, upper: per index, the smallest and largest value (floats: -inf / inf where unbounded).
      alpha: the least probability of another value, per coordinate; ``None``: the paper's ``1 / (n popsize)``.
    """

    indices: tuple[int, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    alpha: float | None = None


def attached(strategy, margin: IntegerMargin | None):
    """A copy of ``strategy`` (``es.CMAES`` or ``es.SepCMAES``) whose update keeps ``margin``. The margin is
    not a constructor argument: ``dataclasses.replace`` drops it, so attach it after replacing."""
    if not hasattr(strategy, "margin"):
        raise TypeError(f"{type(strategy).__name__} has no margin: integer variables need es.CMAES or es.SepCMAES.")
    if margin is not None and not isinstance(margin, IntegerMargin):
        raise TypeError(f"margin must be an es.strategies.margin.IntegerMargin or None, got {margin!r}.")
    made = copy.copy(strategy)
    object.__setattr__(made, "margin", margin)
    return made


def correct(margin: IntegerMargin, mean: jax.Array, std: jax.Array, scaling: jax.Array, popsize: int):
    """``(mean, scaling)`` after the margin: ``std`` is ``sigma sqrt(C_jj)`` per coordinate (float[n], without
    ``scaling``), ``mean`` the updated mean. Only the integer coordinates change."""
    n = mean.shape[0]
    alpha = margin.alpha if margin.alpha is not None else 1.0 / (n * popsize)
    index = jnp.asarray(margin.indices, jnp.int32)
    lo, hi = (jnp.asarray(bound, mean.dtype) for bound in (margin.lower, margin.upper))
    m, base = mean[index], jnp.maximum(std[index], jnp.finfo(mean.dtype).tiny)
    a = scaling[index]
    s = base * a
    cell = jnp.clip(jnp.round(m), lo, hi)
    low, up = cell - 0.5, cell + 0.5
    has_low, has_up = cell > lo, cell < hi
    p_low = jnp.where(has_low, ndtr((low - m) / s), 0.0)
    p_up = jnp.where(has_up, ndtr((m - up) / s), 0.0)

    # an edge: keep the one crossing probability at alpha by moving the mean toward its threshold
    z = -ndtri(jnp.asarray(alpha, mean.dtype))
    edge_m = jnp.where(has_up, jnp.where(p_up < alpha, up - s * z, m), jnp.where(p_low < alpha, low + s * z, m))

    # two neighbours: each side at least alpha / 2, then the mean and A that give those probabilities
    half = alpha / 2
    raised_low, raised_up = jnp.maximum(p_low, half), jnp.maximum(p_up, half)
    middle = 1.0 - p_low - p_up
    excess = raised_low + raised_up + middle - 1.0  # >= 0: what raising the small sides added
    above = raised_low + middle + raised_up - 3 * half
    share = jnp.where(above > 0, excess / jnp.where(above > 0, above, 1.0), 0.0)
    q_low = jnp.clip(raised_low - share * (raised_low - half), 1e-10, 0.5 - 1e-10)
    q_up = jnp.clip(raised_up - share * (raised_up - half), 1e-10, 0.5 - 1e-10)
    z_low, z_up = -ndtri(q_low), -ndtri(q_up)
    side_s = (up - low) / (z_low + z_up)
    side_m = (low * z_up + up * z_low) / (z_low + z_up)
    needs = (p_low < half) | (p_up < half)

    two = has_low & has_up
    one = has_low != has_up
    new_m = jnp.where(two & needs, side_m, jnp.where(one, edge_m, m))
    new_a = jnp.where(two & needs, side_s / base, a)
    return mean.at[index].set(new_m), scaling.at[index].set(new_a)


class Centering(NamedTuple):
    """What integer centering adds to the next update's sums, in ``y`` (module docstring); zeros: nothing.

    Attributes:
      linear: float[n], ``sum_i w_i u_i``.
      outer: float[n, n] (``es.CMAES``) or float[n] (its diagonal, ``es.SepCMAES``).
    """

    linear: jax.Array
    outer: jax.Array


def initial_centering(margin: IntegerMargin | None, mean: jax.Array, full: bool) -> Centering | None:
    """The ``centering`` of a new run: zeros with a margin (``full``: an ``n x n`` outer), ``None`` without."""
    if margin is None:
        return None
    n = mean.shape[0]
    return Centering(filled((n,), 0, mean.dtype), filled((n, n) if full else (n,), 0, mean.dtype))


def centered_sums(centering: Centering, sums, to_z: jax.Array):
    """``sums`` (``linear`` and ``outer`` or ``square``) plus ``centering`` mapped into ``z``: ``to_z`` is
    ``(B D)^-1`` (float[n, n]) or ``1 / sqrt(C)`` (float[n], a diagonal). Called only with a margin (the
    update skips it, and ``to_z``, without one)."""
    if to_z.ndim == 1:
        return sums._replace(linear=sums.linear + to_z * centering.linear,
                             square=sums.square + to_z * to_z * centering.outer)
    return sums._replace(linear=sums.linear + to_z @ centering.linear,
                         outer=sums.outer + to_z @ centering.outer @ to_z.T)


def cleared(centering: Centering | None) -> Centering | None:
    """``centering`` once an update has added it: zeros (``None`` stays ``None``)."""
    return None if centering is None else jax.tree.map(jnp.zeros_like, centering)


def initial_scaling(margin: IntegerMargin | None, mean: jax.Array) -> jax.Array | None:
    """``A`` of a new run: ones with a margin, ``None`` (no state) without."""
    return None if margin is None else filled(mean.shape, 1, mean.dtype)


def scaled(scaling: jax.Array | None, value: jax.Array) -> jax.Array:
    """``value`` times ``A`` along its first axis (``value`` itself without a margin)."""
    if scaling is None:
        return value
    return scaling.reshape(scaling.shape + (1,) * (value.ndim - 1)) * value
