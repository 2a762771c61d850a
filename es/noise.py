"""Noise sources: where a member's N(0, I) perturbation comes from.

A noise source is a small frozen (hashable) config object with three methods:

- ``check(dim)``: raise ``ValueError`` before compilation if it cannot serve
  perturbations of ``dim`` floats;
- ``prepare(dim) -> aux``: traced once per ``evolve`` call on every device,
  builds whatever the source needs (nothing, or the noise table);
- ``sample(aux, key, dim) -> float32[dim]``: the perturbation for one noise key.

``sample`` is a pure function of ``key``, so every device rebuilds exactly the
same perturbation from the same key and nothing is ever transferred.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class GaussianNoise:
    """Fresh N(0, I) draws from each noise key (threefry): the default source.

    Costs one normal sample per parameter per rebuild; exact and unbounded.
    """

    def check(self, dim: int) -> None:
        del dim

    def prepare(self, dim: int) -> None:
        del dim
        return None

    def sample(self, aux: None, key: jax.Array, dim: int) -> jax.Array:
        del aux
        return jax.random.normal(key, (dim,), jnp.float32)


@dataclasses.dataclass(frozen=True)
class NoiseTable:
    """A shared table of N(0, 1) floats; a perturbation is a slice of it.

    As in Salimans et al. (2017): every device computes the same table from
    ``seed`` (it is never transferred) and member noise is
    ``table[offset : offset + dim]`` with ``offset`` drawn uniformly from the
    noise key. Rebuilding a perturbation is then a memory copy instead of
    ``dim`` normal samples.

    Args:
      size: number of float32 values in the table (``4 * size`` bytes on every
        device); must be at least the number of parameters. Larger tables give
        less overlap between members' slices.
      seed: seed of the table (the table, not the run: offsets come from the
        run's keys).
    """

    size: int = 2**25
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(
                f"NoiseTable(size={self.size!r}): size must be a positive int "
                "(number of float32 values), e.g. NoiseTable(size=2**25)."
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"NoiseTable(seed={self.seed!r}): seed must be an int.")

    def check(self, dim: int) -> None:
        if dim > self.size:
            raise ValueError(
                f"NoiseTable(size={self.size}) is smaller than the {dim} parameters "
                f"it must perturb; use NoiseTable(size>={dim}), ideally 10x larger or more."
            )

    def prepare(self, dim: int) -> jax.Array:
        del dim
        return jax.random.normal(jax.random.key(self.seed), (self.size,), jnp.float32)

    def sample(self, aux: jax.Array, key: jax.Array, dim: int) -> jax.Array:
        offset = jax.random.randint(key, (), 0, self.size - dim + 1)
        return jax.lax.dynamic_slice(aux, (offset,), (dim,))


NOISE_SOURCES = (GaussianNoise, NoiseTable)
