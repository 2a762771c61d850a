"""Fitness shaping: turning raw fitnesses into the weights of the gradient estimate.

All functions take fitnesses where higher is better (the engine negates them
first when ``maximize=False``) and return float32 weights of the same shape
``[popsize]``.

- ``centered_rank`` (Salimans et al. 2017): ``w_i = rank_i / (n - 1) - 1/2``,
  ranks from 0 (worst) to ``n - 1`` (best); tied members share their average
  rank, so weights lie in ``[-1/2, 1/2]`` and sum to zero.
- ``z_score``: ``w_i = (f_i - mean f) / std f`` (zeros when ``std f == 0``).
- ``raw``: ``w_i = f_i``.

Invalid fitnesses (NaN or +-inf) count as the worst: under ``centered_rank``
they rank strictly below every valid member; for the other methods (and user
callables) they are replaced by the worst valid fitness before shaping. If no
member is valid all weights are zero, so the update is a no-op.

Strategies with their own rank-based weights (SNES's utilities, CMA-ES's
recombination weights) use ``rank_weights``, which is tie-aware in the same
way: tied members share the mean of their ranks' weights. ``sanitize``
prepares raw values for strategies that use them (ARS).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from es import validation

ShapingFn = Callable[[jax.Array], jax.Array]


def _float():
    """The dtype weights are computed in: float32, or float64 under ``jax_enable_x64`` (which keeps a float64
    fitness's precision in its ranks)."""
    return jnp.result_type(float)


def centered_rank(fitness: jax.Array) -> jax.Array:
    """Centered ranks in ``[-0.5, 0.5]``; ties get their average rank. ``[n] -> [n]``."""
    fitness = jnp.asarray(fitness)
    n = fitness.shape[0]
    below, at_or_below = _tie_groups(fitness)
    rank = (below + at_or_below - 1).astype(_float()) / 2.0
    return rank / (n - 1) - 0.5


def z_score(fitness: jax.Array) -> jax.Array:
    """``(f - mean) / std``; zeros where all fitnesses are equal. ``[n] -> [n]``."""
    fitness = jnp.asarray(fitness, _float())
    centered = fitness - jnp.mean(fitness)
    std = jnp.sqrt(jnp.mean(centered**2))
    return jnp.where(std > 0, centered / jnp.where(std > 0, std, 1.0), 0.0)


def raw(fitness: jax.Array) -> jax.Array:
    """The fitnesses themselves, as floats. ``[n] -> [n]``."""
    return jnp.asarray(fitness, _float())


SHAPING_METHODS: dict[str, ShapingFn] = {
    "centered_rank": centered_rank,
    "z_score": z_score,
    "raw": raw,
}


def shape_fitness(
    fitness: jax.Array, method: str | ShapingFn, maximize: bool
) -> tuple[jax.Array, jax.Array]:
    """Weights for the gradient estimate, robust to invalid fitnesses.

    Args:
      fitness: float32[popsize], as returned by the fitness function.
      method: a name in ``SHAPING_METHODS`` or a callable ``[n] -> [n]``.
      maximize: whether higher fitness is better.

    Returns:
      ``(weights, valid)``: float32[popsize] finite weights (higher = better
      member) and bool[popsize] marking finite fitnesses.
    """
    sanitized, valid = sanitize(fitness, maximize)
    if method == "centered_rank":
        weights = centered_rank(jnp.where(valid, sanitized, -jnp.inf))
    else:
        shaping_fn = SHAPING_METHODS[method] if isinstance(method, str) else method
        weights = jnp.asarray(shaping_fn(sanitized), _float())
    weights = jnp.where(jnp.any(valid) & jnp.isfinite(weights), weights, 0.0)
    return weights, valid


def _tie_groups(better: jax.Array) -> tuple[jax.Array, jax.Array]:
    """For each member, ``[below, at_or_below)``: its tie group's ascending sorted positions (int32[n] each).

    One sort: in ascending order, a group starts where a value differs from the one before and ends where it
    differs from the one after; each member gets its group's bounds through the sorting permutation.
    """
    n = better.shape[0]
    order = jnp.argsort(better)
    ordered = better[order]
    position = jnp.arange(n, dtype=jnp.int32)
    differs = ordered[1:] != ordered[:-1]
    first = jax.lax.cummax(jnp.where(jnp.concatenate([jnp.array([True]), differs]), position, 0))
    end = jax.lax.cummin(jnp.where(jnp.concatenate([differs, jnp.array([True])]), position + 1, n), reverse=True)
    unsorted = jnp.zeros((2, n), jnp.int32).at[:, order].set(jnp.stack([first, end]))
    return unsorted[0], unsorted[1]


def rank_weights(fitness: jax.Array, by_rank: jax.Array, maximize: bool, members: jax.Array | None = None
                 ) -> jax.Array:
    """Weights from ranks: ``by_rank[k]`` for the member of rank ``k`` (0 = best). ``[n] -> [n]``.

    Tied members share the mean of their ranks' weights, so equal fitnesses
    always get equal weights. Invalid fitnesses (NaN, +-inf) rank below every
    valid member and get ``by_rank[-1]``, the worst rank's weight; with no
    valid member every weight is zero. ``members`` (an int, traced; a padded
    program's): only the first ``members`` rank, as if the others were not
    there (``by_rank`` zero from ``members`` on): the rest get weight 0, and
    an invalid member ``by_rank[members - 1]``.
    """
    better = jnp.asarray(fitness, _float())
    better = better if maximize else -better
    valid = jnp.isfinite(better)
    if members is not None:
        live = jnp.arange(better.shape[0]) < members
        valid = valid & live
    below, at_or_below = _tie_groups(jnp.where(valid, better, -jnp.inf))
    ascending = jnp.asarray(by_rank, _float())[::-1]  # worst first, like the sorted fitnesses
    cumulative = jnp.concatenate([jnp.zeros((1,), _float()), jnp.cumsum(ascending)])
    count = at_or_below - below
    tied_mean = (cumulative[at_or_below] - cumulative[below]) / count.astype(_float())
    weights = jnp.where(count == 1, ascending[below], tied_mean)
    if members is None:
        weights = jnp.where(valid, weights, ascending[0])
    else:
        weights = jnp.where(valid, weights, jnp.where(live, ascending[better.shape[0] - members], 0.0))
    return jnp.where(jnp.any(valid), weights, 0.0)


def sanitize(fitness: jax.Array, maximize: bool) -> tuple[jax.Array, jax.Array]:
    """``(better, valid)``: float32 fitnesses where higher is better, invalid ones set to the worst valid.

    With no valid member every value is 0. ``valid`` marks finite fitnesses.
    """
    better = jnp.asarray(fitness, _float())
    better = better if maximize else -better
    valid = jnp.isfinite(better)
    worst_valid = jnp.min(jnp.where(valid, better, jnp.inf))
    return jnp.where(valid, better, jnp.where(jnp.any(valid), worst_valid, 0.0)), valid


def top_k_weights(scores: jax.Array, k: int) -> jax.Array:
    """1 for the ``k`` highest ``scores``, 0 for the rest; scores tied at the cut share what is left.

    ``[n] -> [n]`` float32, summing to ``k``: if ``g`` scores beat the
    ``k``-th highest and ``e`` equal it, each of those ``e`` gets ``(k - g) / e``.
    """
    scores = jnp.asarray(scores, _float())
    kth = jnp.sort(scores)[scores.shape[0] - k]
    above = scores > kth
    at = scores == kth
    share = (k - jnp.sum(above)).astype(_float()) / jnp.maximum(jnp.sum(at), 1).astype(_float())
    return jnp.where(above, 1.0, jnp.where(at, share, 0.0))


# --------------------------------------------------------------------------- checks of a strategy's shaping


def check_shaping(owner: str, value) -> None:
    """``value`` must name a method of ``es.shaping.SHAPING_METHODS`` or be a callable."""
    choices = sorted(SHAPING_METHODS)
    where, use = validation.call(owner, "fitness_shaping", value), f"use one of {choices} or a callable fitness -> weights"
    if isinstance(value, str):
        if value not in SHAPING_METHODS:
            raise ValueError(f"{where} is unknown; {use}.")
    elif not callable(value):
        raise TypeError(f"{where}: {use}.")


def check_shaping_output(owner: str, fn, popsize: int) -> None:
    """A shaping callable must map ``float32[popsize]`` to ``float32[popsize]``."""
    if not callable(fn):
        return
    out = jax.eval_shape(fn, jax.ShapeDtypeStruct((popsize,), jnp.float32))
    if getattr(out, "shape", None) != (popsize,):
        raise TypeError(
            f"{owner}: the fitness_shaping callable must map float32[{popsize}] to float32[{popsize}], "
            f"got {jax.tree.map(lambda x: x.shape, out)}."
        )
