"""What a fitness function receives for a matrix leaf under ``es.LowRankNoise(factored=True)``.

EGGROLL (Sarkar et al. 2025, "Evolution Strategies at the Hyperscale")
perturbs a weight matrix ``W`` of member ``i`` by a rank-``r`` product::

    W_i = W + sigma * s_i * A_i @ B_i.T / sqrt(r)        A_i: [m, r], B_i: [n, r]

A model that multiplies by ``W_i`` never needs it materialised::

    x @ W_i = x @ W + (sigma * s_i / sqrt(r)) * (x @ A_i) @ B_i.T

and under ``vmap`` over members the first product is one matrix product with
the shared ``W`` for the whole batch of members, the second costs
``O((m + n) r)`` per input row. With ``factored=True`` the engine passes each
matrix leaf to the fitness as an ``es.LowRank(base=W, factors=(A_i, B_i),
scale=sigma * s_i / sqrt(r))``, with ``base`` not batched, and model code
multiplies with ``es.matmul(x, w)``, which is ``x @ w`` for a plain array.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class LowRank(NamedTuple):
    """A perturbed matrix leaf kept factored: ``base + scale * (A @ B.T).reshape(base.shape)``.

    Attributes:
      base: the mean's leaf, its own shape and dtype; shared by every member
        (not batched under the engine's ``vmap``).
      factors: ``(A, B)``, float32 ``[m, r]`` and ``[n, r]`` for the leaf's
        matrix view ``(m, n)`` (``es.layout.Layout.matrix_shape``: leading
        axes merged into rows).
      scale: float32 scalar, ``sigma * s_i / sqrt(r)`` (``s_i = -1`` for the
        second member of an antithetic pair).
    """

    base: jax.Array
    factors: tuple[jax.Array, jax.Array]
    scale: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        return self.base.shape

    @property
    def dtype(self):
        return self.base.dtype

    @property
    def ndim(self) -> int:
        return self.base.ndim

    def materialise(self) -> jax.Array:
        """The perturbed leaf as an array of ``base``'s shape and dtype (what non-factored noise gives)."""
        a, b = self.factors
        delta = (self.scale * (a @ b.T)).reshape(self.base.shape)
        return (self.base.astype(jnp.float32) + delta).astype(self.base.dtype)


def matmul(x: jax.Array, w: jax.Array | LowRank) -> jax.Array:
    """``x @ w``, for a plain array ``w`` or a factored ``es.LowRank`` matrix.

    For ``w = LowRank(base, (A, B), scale)`` with a 2-D ``base``::

        x @ base + scale * (x @ A) @ B.T

    in the dtype of ``x @ base``. Use it wherever a model multiplies by a
    weight matrix (a dense layer) so the same code runs with plain params
    and under ``es.LowRankNoise(factored=True)``. Leaves with more than two
    axes (conv kernels) are not matrix products: call ``w.materialise()``.
    """
    if not isinstance(w, LowRank):
        return x @ w
    if w.base.ndim != 2:
        raise ValueError(
            f"es.matmul(x, w): w is an es.LowRank leaf of shape {tuple(w.base.shape)}, not a matrix; "
            "es.matmul multiplies by 2-D weights only. Use w.materialise() for other leaves."
        )
    a, b = w.factors
    out = x @ w.base
    return out + (w.scale * ((x @ a) @ b.T)).astype(out.dtype)


def materialise(w: jax.Array | LowRank) -> jax.Array:
    """``w`` as an array: ``w.materialise()`` for an ``es.LowRank``, ``w`` itself otherwise."""
    return w.materialise() if isinstance(w, LowRank) else w
