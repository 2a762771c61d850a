"""Memory-bounded loops over members: at most ``batch`` perturbations live at once."""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

NOISE_BUDGET_FLOATS = 2**24  # 64 MiB of float32: the most any batch of noise may hold
EVAL_BUDGET_FLOATS = 2**19  # 2 MiB: an evaluation micro-batch's perturbations stay in a core's L2
ACCELERATOR_BUDGET_FLOATS = 2**27  # 512 MiB: on a GPU or TPU, batches as large as memory comfortably allows
UPDATE_CHUNK = 16  # fewest noise vectors per fused step of the gradient sum

REFERENCE_MESH_SIZE = 8  # default micro-batches divide the local population on 1, 2, 4, 8 devices


def budget_batch_size(dim: int, budget: int = NOISE_BUDGET_FLOATS) -> int:
    """How many ``dim``-float noise vectors fit ``budget`` floats (at least 1)."""
    return max(1, budget // dim)


def eval_budget_floats() -> int:
    """Floats an evaluation micro-batch (or a step of the gradient sum) may hold, for JAX's default backend,
    which compiles the run: on a CPU ``EVAL_BUDGET_FLOATS`` (small batches stay in cache, docs/benchmarks.md);
    on a GPU or TPU ``ACCELERATOR_BUDGET_FLOATS``, where every step of a loop over batches costs kernel
    launches and a small batch leaves the device idle (on an H200, the CPU's budget ran 2-5x slower than
    evosax's one batch; docs/benchmarks.md, "On a GPU")."""
    return EVAL_BUDGET_FLOATS if jax.default_backend() == "cpu" else ACCELERATOR_BUDGET_FLOATS


def default_eval_batch_size(popsize: int, dim: int, antithetic: bool = False) -> int:
    """Members per vmapped evaluation micro-batch, independent of the mesh.

    The largest divisor of ``popsize / gcd(popsize, 8)`` whose perturbations
    fit ``EVAL_BUDGET_FLOATS``: it divides every device's share on meshes of
    1, 2, 4 and 8 devices, so every member is evaluated by identically shaped
    code on all of them (XLA may round a batched reduction or matmul
    differently for another batch size, which would break bit-identity across
    device counts). With ``antithetic`` it is even where possible (at least
    2), so batches hold whole pairs that share one noise draw.

    Small batches are faster on CPU (docs/benchmarks.md, "Measurements behind
    the defaults") because the perturbations stay in
    cache between being built and being evaluated; accelerators take the
    largest (``eval_budget_floats``).
    """
    base = popsize // math.gcd(popsize, REFERENCE_MESH_SIZE)
    limit = budget_batch_size(dim, eval_budget_floats())
    divisors = [d for d in range(1, base + 1) if base % d == 0]
    if antithetic and base % 2 == 0:
        return max(d for d in divisors if d % 2 == 0 and d <= max(2, limit))
    return max(d for d in divisors if d <= limit)


def default_update_batch_size(dim: int) -> int:
    """Noise vectors per step of the gradient sum.

    The sum is a fused reduction, so a chunk is never materialised: small
    chunks keep the loop's working set in cache at large ``dim``, and at small
    ``dim`` a chunk as large as ``EVAL_BUDGET_FLOATS`` allows amortises the
    loop's per-step overhead (docs/benchmarks.md). At least ``UPDATE_CHUNK``, at
    most the noise budget (on a GPU or TPU, ``eval_budget_floats`` for both).
    """
    budget = eval_budget_floats()
    return min(max(UPDATE_CHUNK, budget // dim), budget_batch_size(dim, max(budget, NOISE_BUDGET_FLOATS)))


def _length(xs: Any) -> int:
    return jax.tree.leaves(xs)[0].shape[0]


def _chunked(xs: Any, batch: int) -> tuple[Any, Any]:
    """``xs`` split into full chunks ``[n // batch, batch, ...]`` and the remainder."""
    n = _length(xs)
    full = (n // batch) * batch
    chunks = jax.tree.map(lambda x: x[:full].reshape((n // batch, batch) + x.shape[1:]), xs)
    rest = jax.tree.map(lambda x: x[full:], xs)
    return chunks, rest


def map_chunks(f: Callable[[Any], Any], xs: Any, batch: int) -> Any:
    """``f`` applied to consecutive chunks of ``batch`` elements of ``xs``, results concatenated.

    ``xs`` is a pytree of arrays sharing a leading axis; ``f`` maps a chunk
    (leading axis ``batch``, or less for the final partial chunk) to a pytree
    whose leaves have the chunk's length as leading axis. The full chunks run
    sequentially in a ``lax.map`` (a loop even of one iteration, so ``f``
    compiles the same way whatever the length of ``xs``).
    """
    n = _length(xs)
    batch = min(batch, n)
    chunks, rest = _chunked(xs, batch)
    out = jax.lax.map(f, chunks)
    out = jax.tree.map(lambda y: y.reshape((-1,) + y.shape[2:]), out)
    if n % batch:
        out = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), out, f(rest))
    return out


def sum_in_batches(f: Callable[[Any], Any], xs: Any, batch: int, init: Any) -> Any:
    """``init + sum_k f(xs[k*batch:(k+1)*batch])``, accumulated in a fixed order.

    ``xs`` is a pytree of arrays sharing a leading axis; ``f`` maps a chunk of
    it (leading axis <= ``batch``) to a pytree shaped like ``init``. The final
    partial chunk, if any, is added last.
    """
    n = _length(xs)
    batch = min(batch, n)
    chunks, rest = _chunked(xs, batch)
    add = functools.partial(jax.tree.map, jnp.add)
    total, _ = jax.lax.scan(lambda acc, chunk: (add(acc, f(chunk)), None), init, chunks)
    if n % batch:
        total = add(total, f(rest))
    return total


def index_range(start: jax.Array | int, size: int) -> jax.Array:
    """int32[size]: ``start, start + 1, ..., start + size - 1``."""
    return start + jnp.arange(size, dtype=jnp.int32)
