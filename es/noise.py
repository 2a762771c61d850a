"""Noise sources: where a member's N(0, I) perturbation comes from.

A noise source is a small frozen (hashable) config object with four methods

- ``check(dim)``: raise ``ValueError`` before compilation if it cannot serve
  perturbations of ``dim`` floats;
- ``prepare(dim) -> aux``: traced once per ``evolve`` call on every device,
  builds whatever the source needs (nothing, or the noise table);
- ``sample(aux, key, dim) -> float32[dim]``: the perturbation for one noise key;
- ``sums(aux, keys, linear, square, dim) -> (float32[dim], float32[dim] | None)``:
  ``sum_b linear[b] * eps_b`` and, unless ``square`` is ``None``,
  ``sum_b square[b] * eps_b**2``, with ``eps_b = sample(aux, keys[b], dim)``,
  computed the cheapest way the source allows (one pass over the noise,
  without materialising the ``[b, dim]`` perturbations where possible);

and a class attribute ``pairs_share_draws``: whether an antithetic pair should
draw its vector once and use it with both signs during evaluation.

``sample`` is a pure function of ``key``, so every device rebuilds exactly the
same perturbation from the same key and nothing is ever transferred.

Both sources are exact: ``GaussianNoise`` returns ``jax.random.normal(key,
(dim,))`` bit for bit (see ``standard_normal``) and the table is itself such a
draw.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# ----------------------------------------------------------------- exact N(0, 1) draws

_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_THREEFRY_PARITY = np.uint32(0x1BD11BDA)
_MAX_TABLE_SIZE = 2**31 - 1  # offsets are int32


def _rotate_left(x: jax.Array, bits: int) -> jax.Array:
    return (x << np.uint32(bits)) | (x >> np.uint32(32 - bits))


def threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 (20 rounds, Salmon et al. 2011), unrolled, on uint32 arrays.

    The same function as JAX's ``threefry2x32`` primitive (the default PRNG);
    written out here because JAX lowers that primitive on CPU as a rolled loop
    of five steps that XLA cannot fuse, so every step writes and reads the
    whole ``[batch, dim]`` state through memory. Unrolled, XLA fuses the hash,
    the float conversion and whatever consumes the noise into one loop.
    """
    ks = (k0, k1, k0 ^ k1 ^ _THREEFRY_PARITY)
    x0 = x0 + ks[0]
    x1 = x1 + ks[1]
    for step in range(5):
        for rotation in _THREEFRY_ROTATIONS[step % 2]:
            x0 = x0 + x1
            x1 = _rotate_left(x1, rotation)
            x1 = x1 ^ x0
        x0 = x0 + ks[(step + 1) % 3]
        x1 = x1 + ks[(step + 2) % 3] + np.uint32(step + 1)
    return x0, x1


def _bits_to_normal(bits: jax.Array) -> jax.Array:
    """uint32 bits -> float32 N(0, 1), exactly as ``jax.random.normal`` transforms them.

    Uniform on ``[nextafter(-1, 0), 1)`` from the top 23 bits, then
    ``sqrt(2) * erfinv(u)`` (the inverse normal CDF, not an approximation of
    the distribution).
    """
    mantissa = (bits >> np.uint32(9)) | np.uint32(0x3F800000)  # float bits of [1, 2)
    unit = lax.bitcast_convert_type(mantissa, jnp.float32) - np.float32(1.0)
    low = np.nextafter(np.float32(-1.0), np.float32(0.0))
    uniform = jnp.maximum(low, unit * (np.float32(1.0) - low) + low)
    return np.float32(np.sqrt(2)) * lax.erf_inv(uniform)


def _is_threefry(key: jax.Array) -> bool:
    return str(jax.random.key_impl(key)) == "threefry2x32"


def _threefry_normal_from(data: jax.Array, counters: jax.Array) -> jax.Array:
    hi, lo = threefry2x32(data[0], data[1], jnp.zeros_like(counters), counters)
    return _bits_to_normal(hi ^ lo)


# Longest vector whose squares GaussianNoise.sums adds with fused reductions (see there; measured on CPU).
FUSED_SQUARES_MAX_DIM = 2**17

# Values per loop step of ``standard_normal_in_rows``: a cache-sized row.
_ROW = 2**16


def standard_normal_in_rows(key: jax.Array, size: int) -> jax.Array:
    """``standard_normal(key, size)`` computed ``_ROW`` (2**16) values per loop step.

    The same values (element ``i`` always hashes counter ``i``), built by a
    loop whose fused body works on a cache-sized row instead of one fusion
    over the whole table (measured 0.21 against 0.27 CPU seconds for 2**25
    values). For threefry keys only.
    """
    data = jax.random.key_data(key)
    offsets = jnp.arange(-(-size // _ROW), dtype=jnp.uint32) * np.uint32(_ROW)
    rows = lax.map(lambda start: _threefry_normal_from(data, start + lax.iota(jnp.uint32, _ROW)), offsets)
    return rows.reshape(-1)[:size]


def standard_normal(key: jax.Array, dim: int) -> jax.Array:
    """float32[dim] of N(0, 1): exactly ``jax.random.normal(key, (dim,), jnp.float32)``.

    For threefry keys (JAX's default) the bits are computed by the unrolled
    ``threefry2x32`` above with the counters ``jax.random`` uses (its default
    ``jax_threefry_partitionable=True`` layout: element ``i`` hashes the
    counter pair ``(0, i)`` and keeps the XOR of the two output words), so the
    values are bit-identical to JAX's, only faster on CPU. Other key types
    fall back to ``jax.random.normal`` itself.
    """
    if not _is_threefry(key):
        return jax.random.normal(key, (dim,), jnp.float32)
    if dim >= 2**32:
        raise ValueError(f"standard_normal: dim={dim} needs 64-bit counters; use dim < 2**32.")
    return _threefry_normal_from(jax.random.key_data(key), lax.iota(jnp.uint32, dim))


# ----------------------------------------------------------------- sources


@dataclasses.dataclass(frozen=True)
class GaussianNoise:
    """Fresh N(0, I) draws from each noise key: the default source.

    ``sample(None, key, dim) == jax.random.normal(key, (dim,))`` bit for bit,
    computed with a fused threefry (``standard_normal``). Costs one normal
    sample per parameter per rebuild; exact and unbounded.
    """

    pairs_share_draws: ClassVar[bool] = True  # a draw costs more than a copy

    def check(self, dim: int) -> None:
        del dim

    def prepare(self, dim: int) -> None:
        del dim
        return None

    def sample(self, aux: None, key: jax.Array, dim: int) -> jax.Array:
        del aux
        with jax.named_scope("es_noise"):
            return standard_normal(key, dim)

    def sums(self, aux: None, keys: jax.Array, linear: jax.Array, square: jax.Array | None, dim: int):
        """``sum_b linear[b] * eps_b`` (and ``square[b] * eps_b**2``), never materialising ``[b, dim]``.

        Fused reductions of one draw, except squares of vectors longer than
        ``FUSED_SQUARES_MAX_DIM``: those are added in a loop over the ``b``
        vectors, each drawn once. (On CPU, XLA's code for two sibling
        reductions of one fused draw slows sharply past about 1e5 floats per
        vector: 59 s for 16 vectors of 1e6 floats where the loop takes 0.4 s;
        below it the fused reductions are up to 3x faster than the loop.)
        """
        if square is not None and dim > FUSED_SQUARES_MAX_DIM:

            def add_vector(b, acc):
                eps = self.sample(aux, keys[b], dim)
                return acc[0] + linear[b] * eps, acc[1] + square[b] * (eps * eps)

            zeros = jnp.zeros((dim,), jnp.float32)
            return lax.fori_loop(0, linear.shape[0], add_vector, (zeros, zeros))
        eps = jax.vmap(self.sample, in_axes=(None, 0, None))(aux, keys, dim)
        with jax.named_scope("es_noise"):
            total = jnp.sum(linear[:, None] * eps, axis=0)
            if square is None:
                return total, None
            return total, jnp.sum(square[:, None] * (eps * eps), axis=0)


@dataclasses.dataclass(frozen=True)
class NoiseTable:
    """A shared table of N(0, 1) floats; a perturbation is a slice of it.

    As in Salimans et al. (2017): every device computes the same table from
    ``seed`` (it is never transferred) and member noise is
    ``table[offset : offset + dim]`` with ``offset`` drawn uniformly from the
    noise key. Rebuilding a perturbation is then a memory read instead of
    ``dim`` normal samples.

    The table is ``jax.random.normal(jax.random.key(seed), (size,))`` (a
    threefry key whatever ``jax_default_prng_impl`` says), so each entry is
    exactly N(0, 1). Slices of different members overlap when their
    offsets are closer than ``dim``; overlapping slices are shifted copies of
    each other (uncorrelated, but not independent), so prefer
    ``size >= 10 * dim``.

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

    def __post_init__(self):
        if isinstance(self.size, bool) or not isinstance(self.size, int) or not 1 <= self.size <= _MAX_TABLE_SIZE:
            raise ValueError(
                f"NoiseTable(size={self.size!r}): size must be an int in [1, 2**31 - 1] "
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
        with jax.named_scope("es_noise_table"):
            return standard_normal_in_rows(jax.random.key(self.seed, impl="threefry2x32"), self.size)

    def offset(self, key: jax.Array, dim: int) -> jax.Array:
        """int32 start of the slice of noise key ``key``, uniform on ``[0, size - dim]``."""
        return jax.random.randint(key, (), 0, self.size - dim + 1, dtype=jnp.int32)

    def sample(self, aux: jax.Array, key: jax.Array, dim: int) -> jax.Array:
        with jax.named_scope("es_noise"):
            return lax.dynamic_slice(aux, (self.offset(key, dim),), (dim,))

    def sums(self, aux: jax.Array, keys: jax.Array, linear: jax.Array, square: jax.Array | None, dim: int):
        """``sum_b linear[b] * table[o_b : o_b + dim]`` (and ``square[b] * slice**2``), one slice at a time.

        A loop of fused ``acc + c * slice`` steps, in order: it streams the
        table once and never materialises the ``[b, dim]`` slices.
        """
        with jax.named_scope("es_noise"):
            offsets = jax.vmap(self.offset, in_axes=(0, None))(keys, dim)
            zeros = jnp.zeros((dim,), jnp.float32)

            def add_slice(b, acc):
                eps = lax.dynamic_slice(aux, (offsets[b],), (dim,))
                if square is None:
                    return acc + linear[b] * eps
                return acc[0] + linear[b] * eps, acc[1] + square[b] * (eps * eps)

            if square is None:
                return lax.fori_loop(0, linear.shape[0], add_slice, zeros), None
            return lax.fori_loop(0, linear.shape[0], add_slice, (zeros, zeros))


NOISE_SOURCES = (GaussianNoise, NoiseTable)
NoiseSource = GaussianNoise | NoiseTable
