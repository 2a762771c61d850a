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
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

ShapingFn = Callable[[jax.Array], jax.Array]


def centered_rank(fitness: jax.Array) -> jax.Array:
    """Centered ranks in ``[-0.5, 0.5]``; ties get their average rank. ``[n] -> [n]``."""
    fitness = jnp.asarray(fitness)
    n = fitness.shape[0]
    ordered = jnp.sort(fitness)
    below = jnp.searchsorted(ordered, fitness, side="left")
    at_or_below = jnp.searchsorted(ordered, fitness, side="right")
    rank = (below + at_or_below - 1).astype(jnp.float32) / 2.0
    return rank / (n - 1) - 0.5


def z_score(fitness: jax.Array) -> jax.Array:
    """``(f - mean) / std``; zeros where all fitnesses are equal. ``[n] -> [n]``."""
    fitness = jnp.asarray(fitness, jnp.float32)
    centered = fitness - jnp.mean(fitness)
    std = jnp.sqrt(jnp.mean(centered**2))
    return jnp.where(std > 0, centered / jnp.where(std > 0, std, 1.0), 0.0)


def raw(fitness: jax.Array) -> jax.Array:
    """The fitnesses themselves, as float32. ``[n] -> [n]``."""
    return jnp.asarray(fitness, jnp.float32)


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
    better = jnp.asarray(fitness, jnp.float32)
    better = better if maximize else -better
    valid = jnp.isfinite(better)
    any_valid = jnp.any(valid)
    if method == "centered_rank":
        weights = centered_rank(jnp.where(valid, better, -jnp.inf))
    else:
        worst_valid = jnp.min(jnp.where(valid, better, jnp.inf))
        sanitized = jnp.where(valid, better, jnp.where(any_valid, worst_valid, 0.0))
        shaping_fn = SHAPING_METHODS[method] if isinstance(method, str) else method
        weights = jnp.asarray(shaping_fn(sanitized), jnp.float32)
    weights = jnp.where(any_valid & jnp.isfinite(weights), weights, 0.0)
    return weights, valid
