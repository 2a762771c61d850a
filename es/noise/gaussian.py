"""``es.GaussianNoise``: fresh N(0, I) draws from each noise key, the default noise source."""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax

from es.noise.accumulate import MIN_SLICE, accumulate, weighted_sums
from es.noise.layout import Layout
from es.noise.threefry import standard_normal


@dataclasses.dataclass(frozen=True)
class GaussianNoise:
    """Fresh N(0, I) draws from each noise key: the default source.

    ``sample(None, key, layout) == jax.random.normal(key, (D,))`` bit for bit,
    computed with a fused threefry (``standard_normal``). Costs one normal
    sample per parameter per rebuild; exact and unbounded. Coordinate ``j``
    hashes counter ``j``, so a device can rebuild any slice of a member's
    noise alone (``exchange="sharded"``).
    """

    pairs_share_draws: ClassVar[bool] = True  # a draw costs more than a copy
    sliceable: ClassVar[bool] = True
    factored: ClassVar[bool] = False
    independent_coordinates: ClassVar[bool] = True

    def check(self, layout: Layout) -> None:
        del layout

    def prepare(self, layout: Layout) -> None:
        del layout
        return None

    def draw_size(self, layout: Layout) -> int:
        return layout.dim

    def sample(self, aux: None, key: jax.Array, layout: Layout, start=0, size: int | None = None) -> jax.Array:
        """float32[size]: coordinates ``[start, start + size)`` of the noise vector of ``key`` (default: all)."""
        del aux
        with jax.named_scope("es_noise"):
            return standard_normal(key, layout.dim, start, size)

    def sums(self, aux: None, keys, linear, square, layout: Layout, start=0, size: int | None = None):
        """The weighted sums over coordinates ``[start, start + size)``.

        Over ``MIN_SLICE`` coordinates or more: ``accumulate``, each draw
        fused into its step of a member-ordered loop (a slice sums like the
        whole, and at large ``D`` it is faster than one reduction over the
        chunk). Below: ``weighted_sums``, one fused reduction of the chunk's
        draws (faster than the loop at small ``D``, whose steps are then too
        small); ``exchange="sharded"`` never slices that small. Squares
        (SNES, SepCMAES) are summed in the same loop: on CPU, XLA's code for
        two sibling reductions of one fused draw slows sharply at large ``D``.
        docs/benchmarks.md has the measurements.
        """
        size = layout.dim if size is None else size
        with jax.named_scope("es_noise"):
            draw = functools.partial(standard_normal, dim=layout.dim, start=start, size=size)
            if size < MIN_SLICE:
                return weighted_sums(linear, square, jax.vmap(draw)(keys))
            return accumulate(lambda b: draw(keys[b]), linear, square, size)
