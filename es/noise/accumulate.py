"""Weighted sums of noise vectors in a fixed order: what ``Sums`` is made of.

``accumulate`` adds member after member in a loop of fused elementwise steps ``acc + c_b * eps_b``, so
each coordinate's additions happen in member order whatever the number of coordinates summed: a slice of
the coordinates sums to the bits of the same coordinates of the whole (``exchange="sharded"``).
``weighted_sums`` is one vectorised reduction per chunk instead, faster for few coordinates but rounded
by XLA in an order that follows the shape. docs/benchmarks.md has the measurements behind both constants.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

MIN_SLICE = 2**13
"""Coordinates below which ``GaussianNoise.sums`` is one vectorised reduction, and the fewest a device
sums with ``exchange="sharded"`` (so that a slice always takes the member-ordered path, like the whole)."""

UNROLL = 8
"""Steps of ``accumulate``'s loop fused into one pass: the accumulator is read and written once per 8
noise vectors instead of once per vector. The additions stay in member order, but XLA may round the fused
steps differently for another value (inside a whole generation, not in a program of the sums alone), so a
recorded result depends on it; larger values trade compile time for speed (docs/benchmarks.md,
``experiments/bench/unroll.py``).
Read when a program is traced, from this module: set ``importlib.import_module("es.noise.accumulate").UNROLL``
(``es.noise.UNROLL`` is a copy, and ``es.noise.accumulate`` is the function ``accumulate``)."""


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


def outer_sum(outer: jax.Array, eps: jax.Array) -> jax.Array:
    """``sum_b outer[b] * eps[b] eps[b]^T``: float[D, D], one matrix product of the chunk ``eps`` ([b, D])."""
    weighted = (outer[:, None] * eps).astype(outer.dtype)
    return jnp.einsum("bi,bj->ij", weighted, eps.astype(outer.dtype), precision=lax.Precision.HIGHEST)


def accumulate(eps_of: Callable[[jax.Array], jax.Array], linear: jax.Array, square: jax.Array | None, size: int):
    """``sum_b linear[b] * eps_of(b)`` and ``sum_b square[b] * eps_of(b)**2`` (or ``None``), ``b`` in order.

    A loop of fused elementwise steps ``acc + c_b * eps_b``: the additions of
    each coordinate happen in member order whatever ``size`` is, so a slice of
    the coordinates sums to the same bits as the same coordinates of the
    whole (``exchange="sharded"``). Nothing ``[b, size]`` is materialised.
    The sums have the coefficients' dtype (float32; float64 under x64).
    """
    zeros = jnp.zeros((size,), linear.dtype)

    def add(b, acc):
        eps = eps_of(b)
        if square is None:
            return acc + linear[b] * eps
        return acc[0] + linear[b] * eps, acc[1] + square[b] * (eps * eps)

    if square is None:
        return lax.fori_loop(0, linear.shape[0], add, zeros, unroll=UNROLL), None
    return lax.fori_loop(0, linear.shape[0], add, (zeros, zeros), unroll=UNROLL)
