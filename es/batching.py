"""Memory-bounded loops over members: at most ``batch`` perturbations live at once."""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

NOISE_BUDGET_FLOATS = 2**24  # 64 MiB of float32 per materialised noise batch


REFERENCE_MESH_SIZE = 8  # default micro-batches divide the local population on 1, 2, 4, 8 devices


def budget_batch_size(dim: int) -> int:
    """How many ``dim``-float noise vectors fit the materialisation budget."""
    return max(1, NOISE_BUDGET_FLOATS // dim)


def default_eval_batch_size(popsize: int, dim: int) -> int:
    """Members per vmapped evaluation micro-batch, independent of the mesh.

    The largest divisor of ``popsize / gcd(popsize, 8)`` that fits the budget:
    it divides every device's share on meshes of 1, 2, 4 and 8 devices, so
    every member is evaluated by identically shaped code on all of them (XLA
    may round a batched reduction or matmul differently for another batch
    size, which would break bit-identity across device counts).
    """
    base = popsize // math.gcd(popsize, REFERENCE_MESH_SIZE)
    limit = budget_batch_size(dim)
    return max(d for d in range(1, min(base, limit) + 1) if base % d == 0)


def _length(xs: Any) -> int:
    return jax.tree.leaves(xs)[0].shape[0]


def map_in_batches(f: Callable[[Any], Any], xs: Any, batch: int) -> Any:
    """``vmap(f)(xs)`` computed ``batch`` elements at a time (sequentially).

    ``xs`` is a pytree of arrays sharing a leading axis; the result is stacked
    along that axis. Always a loop (even of one iteration) so that ``f``'s
    batch compiles the same way whatever the length of ``xs``.
    """
    return jax.lax.map(f, xs, batch_size=min(batch, _length(xs)))


def sum_in_batches(f: Callable[[Any], jax.Array], xs: Any, batch: int, init: jax.Array) -> jax.Array:
    """``init + sum_k f(xs[k*batch:(k+1)*batch])``, accumulated in a fixed order.

    ``xs`` is a pytree of arrays sharing a leading axis; ``f`` maps a chunk of
    it (leading axis <= ``batch``) to an array shaped like ``init``. The final
    partial chunk, if any, is added last.
    """
    n = _length(xs)
    batch = min(batch, n)
    full = (n // batch) * batch
    chunks = jax.tree.map(lambda x: x[:full].reshape((n // batch, batch) + x.shape[1:]), xs)
    total, _ = jax.lax.scan(lambda acc, chunk: (acc + f(chunk), None), init, chunks)
    if full < n:
        total = total + f(jax.tree.map(lambda x: x[full:], xs))
    return total


def index_range(start: jax.Array | int, size: int) -> jax.Array:
    """int32[size]: ``start, start + 1, ..., start + size - 1``."""
    return start + jnp.arange(size, dtype=jnp.int32)
