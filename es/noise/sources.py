"""Noise sources: where a member's unit perturbation ``eps`` comes from.

A noise source is a small frozen (hashable) config object. Its methods take
the params' ``es.layout.Layout`` (static leaf shapes; ``layout.dim`` = ``D``)::

    check(layout)                     raise ValueError before compilation if it cannot serve these params
    prepare(layout) -> aux            traced once per evolve call on every device (nothing, or the table)
    draw_size(layout) -> int          floats drawn per noise vector (``D``; less for low-rank noise)
    sample(aux, key, layout)          -> float32[D], the perturbation of one noise key, ravel order
    sums(aux, keys, linear, square, layout, start=0, size=D)
        -> (sum_b linear[b] * eps_b[start:start+size],  sum_b square[b] * eps_b[start:start+size]**2 | None)

``sums`` is computed the cheapest way the source allows (one pass over the
noise, never materialising the ``[b, D]`` perturbations where possible), and
over a slice of the coordinates when ``start``/``size`` say so
(``exchange="sharded"``: each device sums its own slice). Class attributes:

- ``pairs_share_draws``: whether an antithetic pair should draw its vector
  once and use it with both signs during evaluation;
- ``sliceable``: whether ``sums`` over a coordinate slice costs only that
  slice and equals the same coordinates of the full sums bit for bit (what
  ``exchange="sharded"`` needs);
- ``factored``: whether the fitness receives matrix leaves as ``es.LowRank``
  values (``LowRankNoise(factored=True)``) instead of arrays;
- ``independent_coordinates``: whether the coordinates of one ``eps`` are
  independent N(0, 1) (what per-coordinate variance updates, which read
  ``eps**2``, assume).

``sample`` is a pure function of ``key``, so every device rebuilds exactly the
same perturbation from the same key and nothing is ever transferred.

``GaussianNoise`` returns ``jax.random.normal(key, (D,))`` bit for bit (see
``standard_normal``), the table is itself such a draw, and ``LowRankNoise``
builds each matrix leaf's perturbation from two such draws.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from es import validation
from es.noise.layout import Layout
from es.noise.lowrank import LowRank

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


def standard_normal(key: jax.Array, dim: int, start: int | jax.Array = 0, size: int | None = None) -> jax.Array:
    """float32[size]: elements ``[start, start + size)`` of ``jax.random.normal(key, (dim,), jnp.float32)``.

    For threefry keys (JAX's default) the bits are computed by the unrolled
    ``threefry2x32`` above with the counters ``jax.random`` uses (its default
    ``jax_threefry_partitionable=True`` layout: element ``i`` hashes the
    counter pair ``(0, i)`` and keeps the XOR of the two output words), so the
    values are bit-identical to JAX's, only faster on CPU; and a slice costs
    only its own ``size`` hashes (``start`` may be traced; ``size`` is static,
    default ``dim``). Other key types fall back to ``jax.random.normal`` and
    slice its full draw.
    """
    size = dim if size is None else size
    if not _is_threefry(key):
        return lax.dynamic_slice(jax.random.normal(key, (dim,), jnp.float32), (start,), (size,))
    if dim >= 2**32:
        raise ValueError(f"standard_normal: dim={dim} needs 64-bit counters; use dim < 2**32.")
    counters = lax.iota(jnp.uint32, size)
    if not (isinstance(start, int) and start == 0):
        counters = counters + jnp.asarray(start).astype(jnp.uint32)
    return _threefry_normal_from(jax.random.key_data(key), counters)


MIN_SLICE = 2**13
"""Coordinates below which ``GaussianNoise.sums`` is one vectorised reduction, and the fewest a device
sums with ``exchange="sharded"`` (so that a slice always takes the member-ordered path, like the whole)."""


UNROLL = 8
"""Steps of ``accumulate``'s loop fused into one pass: the accumulator is read and written once per 8
noise vectors instead of once per vector (1e6 params, popsize 256, one core: 14% less CPU per generation
with PRNG noise, 1.19 -> 1.03 s, and about as much with the table). The additions stay in member order."""


def weighted_sums(linear: jax.Array, square: jax.Array | None, eps: jax.Array):
    """``sum_b linear[b] * eps[b]`` and ``sum_b square[b] * eps[b]**2`` (or ``None``): one fused reduction each.

    XLA on CPU picks the order of such a reduction by shape (a ``[32, 200]``
    and a ``[32, 25]`` sum of the same columns differ in the last bit), so a
    slice of the coordinates does not sum like the whole: ``accumulate`` does.
    """
    total = jnp.sum(linear[:, None] * eps, axis=0)
    if square is None:
        return total, None
    return total, jnp.sum(square[:, None] * (eps * eps), axis=0)


def accumulate(eps_of: Callable[[jax.Array], jax.Array], linear: jax.Array, square: jax.Array | None, size: int):
    """``sum_b linear[b] * eps_of(b)`` and ``sum_b square[b] * eps_of(b)**2`` (or ``None``), ``b`` in order.

    A loop of fused elementwise steps ``acc + c_b * eps_b``: the additions of
    each coordinate happen in member order whatever ``size`` is, so a slice of
    the coordinates sums to the same bits as the same coordinates of the
    whole (``exchange="sharded"``). Nothing ``[b, size]`` is materialised.
    """
    zeros = jnp.zeros((size,), jnp.float32)

    def add(b, acc):
        eps = eps_of(b)
        if square is None:
            return acc + linear[b] * eps
        return acc[0] + linear[b] * eps, acc[1] + square[b] * (eps * eps)

    if square is None:
        return lax.fori_loop(0, linear.shape[0], add, zeros, unroll=UNROLL), None
    return lax.fori_loop(0, linear.shape[0], add, (zeros, zeros), unroll=UNROLL)


# ----------------------------------------------------------------- sources


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
        whole; at 1e6 params 1.5x faster than one reduction over the chunk).
        Below: ``weighted_sums``, one fused reduction of the chunk's draws
        (at 1e3 params 2x faster than the loop, whose steps are then too
        small); ``exchange="sharded"`` never slices that small. Squares
        (SNES, SepCMAES) are summed in the same loop: on CPU, XLA's code for
        two sibling reductions of one fused draw slows sharply at large ``D``
        (59 s for 16 vectors of 1e6 floats where the loop takes 0.4 s).
        """
        size = layout.dim if size is None else size
        with jax.named_scope("es_noise"):
            draw = functools.partial(standard_normal, dim=layout.dim, start=start, size=size)
            if size < MIN_SLICE:
                return weighted_sums(linear, square, jax.vmap(draw)(keys))
            return accumulate(lambda b: draw(keys[b]), linear, square, size)


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
        if isinstance(self.size, bool) or not isinstance(self.size, int) or not 1 <= self.size <= _MAX_TABLE_SIZE:
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


NOISE_SOURCES = (GaussianNoise, NoiseTable, LowRankNoise)
NoiseSource = GaussianNoise | NoiseTable | LowRankNoise
