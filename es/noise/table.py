"""``es.NoiseTable``: a shared table of N(0, 1) floats, a perturbation being a slice of it (Salimans et al. 2017)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from es.noise.accumulate import accumulate
from es.noise.layout import Layout
from es.noise.threefry import standard_normal_in_rows

MAX_TABLE_SIZE = 2**31 - 1  # offsets are int32


@dataclasses.dataclass(frozen=True)
class NoiseTable:
    """A shared table of N(0, 1) floats; a perturbation is a slice of it.

    As in Salimans et al. (2017): every device computes the same table from
    ``seed`` (it is never transferred) and member noise is
    ``table[offset : offset + D]`` with ``offset`` drawn uniformly from the
    noise key. Rebuilding a perturbation is then a memory read instead of
    ``D`` normal samples, and coordinates ``[start, start + size)`` of it are
    the read ``table[offset + start : offset + start + size]``.

    The table is ``jax.random.normal(jax.random.key(seed), (size,))`` (a
    threefry key whatever ``jax_default_prng_impl`` says), so each entry is
    exactly N(0, 1). Slices of different members overlap when their
    offsets are closer than ``D``; overlapping slices are shifted copies of
    each other (uncorrelated, but not independent), so prefer
    ``size >= 10 * D``.

    Args:
      size: number of float32 values in the table (``4 * size`` bytes on every
        device, built once per ``evolve`` call); at least the number of
        parameters and below ``2**31``.
      seed: seed of the table (the table, not the run: offsets come from the
        run's keys).
    """

    size: int = 2**25
    seed: int = 0

    pairs_share_draws: ClassVar[bool] = False  # re-reading a slice is as cheap as copying it
    sliceable: ClassVar[bool] = True
    factored: ClassVar[bool] = False
    independent_coordinates: ClassVar[bool] = True

    def __post_init__(self):
        if isinstance(self.size, bool) or not isinstance(self.size, int) or not 1 <= self.size <= MAX_TABLE_SIZE:
            raise ValueError(
                f"NoiseTable(size={self.size!r}): size must be an int in [1, 2**31 - 1] "
                "(number of float32 values), e.g. NoiseTable(size=2**25)."
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"NoiseTable(seed={self.seed!r}): seed must be an int.")

    def check(self, layout: Layout) -> None:
        if layout.dim > self.size:
            raise ValueError(
                f"NoiseTable(size={self.size}) is smaller than the {layout.dim} parameters "
                f"it must perturb; use NoiseTable(size>={layout.dim}), ideally 10x larger or more."
            )

    def prepare(self, layout: Layout) -> jax.Array:
        del layout
        with jax.named_scope("es_noise_table"):
            return standard_normal_in_rows(jax.random.key(self.seed, impl="threefry2x32"), self.size)

    def draw_size(self, layout: Layout) -> int:
        return layout.dim

    def offset(self, key: jax.Array, dim: int) -> jax.Array:
        """int32 start of the slice of noise key ``key``, uniform on ``[0, size - dim]``."""
        return jax.random.randint(key, (), 0, self.size - dim + 1, dtype=jnp.int32)

    def sample(self, aux: jax.Array, key: jax.Array, layout: Layout, start=0, size: int | None = None) -> jax.Array:
        """float32[size]: coordinates ``[start, start + size)`` of the noise vector of ``key`` (default: all)."""
        size = layout.dim if size is None else size
        with jax.named_scope("es_noise"):
            return lax.dynamic_slice(aux, (self.offset(key, layout.dim) + start,), (size,))

    def sums(self, aux: jax.Array, keys, linear, square, layout: Layout, start=0, size: int | None = None):
        """``sum_b linear[b] * table[o_b + start : o_b + start + size]`` (and ``square[b] * slice**2``).

        A loop of fused ``acc + c * slice`` steps, in order: it streams the
        table once and never materialises the ``[b, size]`` slices. ``start +
        size <= D`` keeps every read inside the member's own slice (the
        engine never asks for coordinates past ``D``).
        """
        size = layout.dim if size is None else size
        with jax.named_scope("es_noise"):
            offsets = jax.vmap(self.offset, in_axes=(0, None))(keys, layout.dim) + start
            return accumulate(lambda b: lax.dynamic_slice(aux, (offsets[b],), (size,)), linear, square, size)
