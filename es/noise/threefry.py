"""Exact N(0, 1) draws: JAX's threefry2x32 hash written out so that XLA fuses it with its consumer.

``standard_normal(key, dim)`` returns ``jax.random.normal(key, (dim,), jnp.float32)`` bit for bit, for
threefry keys (JAX's default). JAX lowers its threefry primitive on CPU as a rolled loop of five steps
that XLA cannot fuse, so every step streams the whole ``[batch, dim]`` state through memory; unrolled
here in ``jax.lax``, the hash, the uniform -> ``sqrt(2) erfinv`` transform and whatever consumes the
noise (a perturbation, a sum) fuse into one loop. Element ``i`` hashes counter ``i``, so coordinates
``[start, start + size)`` of a draw cost ``size`` hashes. docs/benchmarks.md has the measured speeds.

Written with ``lax`` functions, not array operators: each operator goes through a ``jax.numpy`` wrapper that
costs time (about a fifth of the tracing and lowering of an ``es.evolve`` program) and makes the same program.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_THREEFRY_PARITY = np.uint32(0x1BD11BDA)


def _rotate_left(x: jax.Array, bits: int) -> jax.Array:
    return lax.bitwise_or(lax.shift_left(x, np.uint32(bits)), lax.shift_right_logical(x, np.uint32(32 - bits)))


def threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 (20 rounds, Salmon et al. 2011), unrolled, on uint32 arrays.

    The same function as JAX's ``threefry2x32`` primitive (the default PRNG);
    written out here because JAX lowers that primitive on CPU as a rolled loop
    of five steps that XLA cannot fuse, so every step writes and reads the
    whole ``[batch, dim]`` state through memory. Unrolled, XLA fuses the hash,
    the float conversion and whatever consumes the noise into one loop.
    """
    k0, k1, x0, x1 = (jnp.asarray(v, jnp.uint32) for v in (k0, k1, x0, x1))
    return _rounds((k0, k1, x0, x1), lax.add, lax.bitwise_xor, _rotate_left)


def _rounds(words, add, xor, rotate_left):
    """Threefry-2x32's 20 rounds on ``(k0, k1, x0, x1)`` with the given uint32 operations: ``(x0, x1)``."""
    k0, k1, x0, x1 = words
    ks = (k0, k1, xor(xor(k0, k1), _THREEFRY_PARITY))
    x0 = add(x0, ks[0])
    x1 = add(x1, ks[1])
    for step in range(5):
        for rotation in _THREEFRY_ROTATIONS[step % 2]:
            x0 = add(x0, x1)
            x1 = rotate_left(x1, rotation)
            x1 = xor(x1, x0)
        x0 = add(x0, ks[(step + 1) % 3])
        x1 = add(add(x1, ks[(step + 2) % 3]), np.uint32(step + 1))
    return x0, x1


def fold_in_on_host(seed: int, data: int) -> np.ndarray:
    """The key data (uint32[2]) of ``jax.random.fold_in(jax.random.key(seed), data)`` for JAX's default
    threefry keys, computed with numpy: no program to compile (``jax.random.wrap_key_data`` makes the key).
    ``0 <= seed < 2**64``, ``0 <= data < 2**32``."""
    words = [np.array([v], np.uint32) for v in (seed >> 32, seed & 0xFFFFFFFF, 0, data)]  # key(seed), seed(data)
    x0, x1 = _rounds(words, np.add, np.bitwise_xor,
                     lambda x, bits: (x << np.uint32(bits)) | (x >> np.uint32(32 - bits)))
    return np.concatenate([x0, x1])


def _bits_to_normal(bits: jax.Array) -> jax.Array:
    """uint32 bits -> float32 N(0, 1), exactly as ``jax.random.normal`` transforms them.

    Uniform on ``[nextafter(-1, 0), 1)`` from the top 23 bits, then
    ``sqrt(2) * erfinv(u)`` (the inverse normal CDF, not an approximation of
    the distribution).
    """
    mantissa = lax.bitwise_or(lax.shift_right_logical(bits, np.uint32(9)), np.uint32(0x3F800000))  # [1, 2)
    unit = lax.sub(lax.bitcast_convert_type(mantissa, jnp.float32), np.float32(1.0))
    low = np.nextafter(np.float32(-1.0), np.float32(0.0))
    uniform = lax.max(low, lax.add(lax.mul(unit, np.float32(1.0) - low), low))
    return lax.mul(np.float32(np.sqrt(2)), lax.erf_inv(uniform))


def is_threefry(key: jax.Array) -> bool:
    """Whether ``key`` is a threefry key (JAX's default implementation), which this module's hash serves."""
    return str(jax.random.key_impl(key)) == "threefry2x32"


def _threefry_normal_from(data: jax.Array, counters: jax.Array) -> jax.Array:
    hi, lo = threefry2x32(data[0], data[1], jnp.zeros_like(counters), counters)
    return _bits_to_normal(lax.bitwise_xor(hi, lo))


# Values per loop step of ``standard_normal_in_rows``: a cache-sized row.
_ROW = 2**16


def standard_normal_in_rows(key: jax.Array, size: int) -> jax.Array:
    """``standard_normal(key, size)`` computed ``_ROW`` (2**16) values per loop step.

    The same values (element ``i`` always hashes counter ``i``), built by a
    loop whose fused body works on a cache-sized row instead of one fusion
    over the whole table (faster, docs/benchmarks.md). For threefry keys only.
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
    if not is_threefry(key):
        return lax.dynamic_slice(jax.random.normal(key, (dim,), jnp.float32), (start,), (size,))
    if dim >= 2**32:
        raise ValueError(f"standard_normal: dim={dim} needs 64-bit counters; use dim < 2**32.")
    counters = lax.iota(jnp.uint32, size)
    if not (isinstance(start, int) and start == 0):
        counters = counters + jnp.asarray(start).astype(jnp.uint32)
    return _threefry_normal_from(jax.random.key_data(key), counters)

