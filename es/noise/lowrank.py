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

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from es import validation
from es.noise.accumulate import weighted_sums
from es.noise.layout import Layout
from es.noise.threefry import standard_normal


class LowRank(NamedTuple):
    """A perturbed matrix leaf kept factored: ``base + scale * (A @ B.T).reshape(base.shape)``.

    Attributes:
      base: the mean's leaf, its own shape and dtype; shared by every member
        (not batched under the engine's ``vmap``).
      factors: ``(A, B)``, float32 ``[m, r]`` and ``[n, r]`` for the leaf's
        matrix view ``(m, n)`` (``es.Layout.matrix_shape``: leading
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


# --------------------------------------------------------------------------- the noise source


@dataclasses.dataclass(frozen=True)
class LowRankNoise:
    """Low-rank perturbations of matrix leaves (EGGROLL: Sarkar et al. 2025, "Evolution Strategies at the Hyperscale").

    For every leaf with two or more axes, viewed as the matrix ``(m, n) =
    (prod(shape[:-1]), shape[-1])`` (leading axes merged into rows, the last
    axis kept: a dense kernel ``[in, out]`` is itself, a conv kernel ``[h,
    w, in, out]`` is ``[h*w*in, out]``), the unit perturbation of a noise key
    is::

        eps = A @ B.T / sqrt(r)            A: [m, r], B: [n, r], entries N(0, 1)

    so each entry has variance 1, as with Gaussian noise, and ``sigma`` keeps
    its meaning. Vectors and scalars (biases, norms) get full-rank N(0, 1)
    noise. ``A``, ``B`` and the vector noise are one ``standard_normal`` draw
    of ``draw_size`` floats, ``sum (m + n) r`` plus the vector sizes, from
    the member's noise key: far fewer than ``D``.

    The update's sum of ``c_i * eps_i`` over a chunk of members is, per
    matrix leaf, one matrix product ``[m, b r] @ [b r, n]`` (never one per
    member). Only strategies that adapt the mean are sound with it:
    ``es.OpenES``, ``es.ARS``, ``es.PGPE(sigma_learning_rate=0)``; the
    per-coordinate variance updates of SNES, sep-CMA-ES and PGPE's sigma
    read ``eps**2``, whose coordinates are not independent here, and refuse
    it.

    Args:
      rank: ``r >= 1``, the rank of each matrix perturbation.
      factored: pass matrix leaves to the fitness as ``es.LowRank(base,
        (A, B), scale)`` values instead of materialised arrays; the model
        multiplies with ``es.matmul(x, w)``, so every member shares one
        product with the base weights (docs/lowrank.md).
    """

    rank: int = 1
    factored: bool = False

    pairs_share_draws: ClassVar[bool] = True  # a pair shares its materialised A @ B.T
    sliceable: ClassVar[bool] = False  # the update is a matrix product: exchange="sharded" is refused
    independent_coordinates: ClassVar[bool] = False  # eps**2 of a product: per-coordinate variance updates refuse it

    def __post_init__(self):
        validation.check_int("LowRankNoise", "rank", self.rank, 1, "the rank of each matrix perturbation")
        validation.check_bool("LowRankNoise", "factored", self.factored)

    @property
    def norm(self) -> np.float32:
        """``1 / sqrt(r)``, which makes every entry of ``A @ B.T / sqrt(r)`` unit variance."""
        return np.float32(1 / np.sqrt(self.rank))

    def check(self, layout: Layout) -> None:
        if layout.dim >= 2**32 or self.draw_size(layout) >= 2**32:
            raise ValueError(f"LowRankNoise: {layout.dim} params need 64-bit counters; use fewer than 2**32.")
        if all(layout.matrix_shape(shape) is None for shape in layout.shapes):
            raise ValueError(
                f"{self!r}: the params have no leaf with two or more axes (leaf shapes {list(layout.shapes)}), so "
                "every coordinate would get full-rank noise, as es.GaussianNoise() gives; pass weight matrices as "
                "2-D leaves (e.g. {'w': w.reshape(m, n)}) or use noise=es.GaussianNoise()."
            )

    def prepare(self, layout: Layout) -> None:
        del layout
        return None

    def parts(self, layout: Layout) -> tuple[tuple[int, tuple[int, int] | None], ...]:
        """Per leaf: where its noise starts in the draw, and its matrix view (``None`` for a vector)."""
        parts, start = [], 0
        for shape, size in zip(layout.shapes, layout.sizes):
            matrix = layout.matrix_shape(shape)
            parts.append((start, matrix))
            start += size if matrix is None else (matrix[0] + matrix[1]) * self.rank
        return tuple(parts)

    def draw_size(self, layout: Layout) -> int:
        parts = zip(layout.sizes, self.parts(layout))
        return sum(size if matrix is None else (matrix[0] + matrix[1]) * self.rank for size, (_, matrix) in parts)

    def draw(self, key: jax.Array, layout: Layout) -> list:
        """One noise key's draw, split per leaf: ``(A, B)`` for a matrix leaf, ``float32[size]`` for a vector."""
        with jax.named_scope("es_noise"):
            z = standard_normal(key, self.draw_size(layout))
        draws = []
        for size, (start, matrix) in zip(layout.sizes, self.parts(layout)):
            if matrix is None:
                draws.append(z[start:start + size])
            else:
                (m, n), r = matrix, self.rank
                draws.append((z[start:start + m * r].reshape(m, r), z[start + m * r:start + (m + n) * r].reshape(n, r)))
        return draws

    def sample(self, aux: None, key: jax.Array, layout: Layout) -> jax.Array:
        """float32[D]: ``A @ B.T / sqrt(r)`` raveled for matrix leaves, the vector draw for the rest."""
        del aux
        parts = []
        with jax.named_scope("es_noise"):
            for (_, matrix), draw in zip(self.parts(layout), self.draw(key, layout)):
                parts.append(draw if matrix is None else ((draw[0] @ draw[1].T) * self.norm).reshape(-1))
            return jnp.concatenate(parts)

    def sums(self, aux: None, keys, linear, square, layout: Layout, start=0, size: int | None = None):
        """``sum_b linear[b] * eps_b``: one product ``[m, b r] @ [b r, n]`` per matrix leaf, fused sums for vectors."""
        del aux
        if square is not None or not (isinstance(start, int) and start == 0 and size in (None, layout.dim)):
            raise ValueError("LowRankNoise.sums: squared sums and coordinate slices are not supported.")
        draws = jax.vmap(lambda key: self.draw(key, layout))(keys)
        parts = []
        with jax.named_scope("es_noise"):
            for (_, matrix), draw in zip(self.parts(layout), draws):
                if matrix is None:
                    parts.append(weighted_sums(linear, None, draw)[0])
                else:
                    a, b = draw
                    parts.append(jnp.einsum("bmr,bnr->mn", a * (linear * self.norm)[:, None, None], b).reshape(-1))
            return jnp.concatenate(parts), None

    def factored_members(self, params, keys: jax.Array, scales: jax.Array, layout: Layout):
        """What the fitness receives for a batch of members, and the ``vmap`` ``in_axes`` that go with it.

        Args:
          params: the mean (a pytree of ``layout``).
          keys: the members' noise keys, ``[b]``.
          scales: float32[b], ``sigma * s_i`` of each member (a scalar scale).

        Returns:
          ``(members, in_axes)``: ``params``'s structure with each matrix
          leaf an ``es.LowRank(base, (A [b, m, r], B [b, n, r]), scale [b])``
          whose ``base`` is not batched (``in_axes`` ``None``), and each other
          leaf the batch of perturbed arrays ``[b, *shape]``.
        """
        leaves, treedef = jax.tree.flatten(params)
        draws = jax.vmap(lambda key: self.draw(key, layout))(keys)
        members, axes = [], []
        for leaf, (_, matrix), draw in zip(leaves, self.parts(layout), draws):
            if matrix is None:
                perturbed = leaf.reshape(-1).astype(jnp.float32) + scales[:, None] * draw
                members.append(perturbed.astype(leaf.dtype).reshape((-1,) + leaf.shape))
                axes.append(0)
            else:
                members.append(LowRank(leaf, draw, scales * self.norm))
                axes.append(LowRank(None, (0, 0), 0))
        return jax.tree.unflatten(treedef, members), jax.tree.unflatten(treedef, axes)

    def factored_example(self, params, layout: Layout):
        """One member's fitness input as ``jax.ShapeDtypeStruct`` leaves (to check the fitness before compiling)."""
        f32 = jnp.float32
        leaves, treedef = jax.tree.flatten(params)
        example = []
        for leaf, (_, matrix) in zip(leaves, self.parts(layout)):
            base = jax.ShapeDtypeStruct(jnp.shape(leaf), jnp.result_type(leaf))
            if matrix is None:
                example.append(base)
            else:
                (m, n), r = matrix, self.rank
                factors = (jax.ShapeDtypeStruct((m, r), f32), jax.ShapeDtypeStruct((n, r), f32))
                example.append(LowRank(base, factors, jax.ShapeDtypeStruct((), f32)))
        return jax.tree.unflatten(treedef, example)
