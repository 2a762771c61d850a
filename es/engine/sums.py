"""Step 4 of a generation: the ``Sums`` the update needs, rebuilt from shared keys, as each exchange mode forms them.

Nothing population-sized is stored: every device rebuilds the noise vectors ``update_batch_size`` at a
time, in member order, and adds them up (``rebuild``). The exchange mode decides which members and which
coordinates a device sums, and what crosses devices (docs/scaling.md):

- ``"fitness"``: every device sums every member over all ``D`` coordinates (or, where the update itself is
  split, over its own part of them: ``es.engine.update``);
- ``"sharded"``: device ``d`` sums every member over its slice of the coordinates and the slices are
  all-gathered and put back in order: the same additions in the same order as ``"fitness"``, the same bits;
- ``"gradient"``: every device sums its own members and the sums are all-reduced (the grouping of the
  additions follows the mesh).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from es.engine import members as population
from es.engine.batching import sum_in_batches
from es.engine.partition import Partition
from es.noise.accumulate import outer_sum, weighted_sums
from es.strategies.base import Coefficients, Sums


def for_update(members: population.Generation, coefficients: Coefficients, part: Partition, local_members, mesh: Mesh,
               execution) -> Sums:
    """The ``Sums`` this device's part of the update needs, formed as ``execution.exchange`` says."""
    batch = execution.update_batch_size
    everyone = jnp.arange(coefficients.linear.shape[0], dtype=jnp.int32)
    if part.split:  # the update itself is split: this device's part of the coordinates only
        return rebuild(members, coefficients, everyone, batch, part.start(jax.lax.axis_index(mesh.axis_names)),
                       part.size)
    if execution.exchange == "gradient":
        sums = rebuild(members, coefficients, local_members, batch)
        with jax.named_scope("es_exchange"):
            return jax.lax.psum(sums, mesh.axis_names)
    slices = Partition(members.dim, mesh.size)
    if execution.exchange == "fitness" or not slices.split:
        return rebuild(members, coefficients, everyone, batch)
    start = slices.start(jax.lax.axis_index(mesh.axis_names))
    mine = rebuild(members, coefficients, everyone, batch, start, slices.size)
    with jax.named_scope("es_exchange"):
        gathered = jax.lax.all_gather(mine, mesh.axis_names, tiled=True)
    return jax.tree.map(slices.assemble, gathered)


def rebuild(members: population.Generation, coefficients: Coefficients, summed: jax.Array, batch: int,
            start: int | jax.Array = 0, size: int | None = None) -> Sums:
    """``Sums`` over the consecutive members ``summed``, accumulated chunk by chunk in member order.

    Over coordinates ``[start, start + size)`` (default: all ``D``). With
    antithetic pairs (``summed`` of even length from an even index) each
    noise vector is rebuilt once: pair ``j`` contributes ``(a_2j - a_2j+1) *
    eps_j``, ``(b_2j + b_2j+1) * eps_j**2`` and ``(c_2j + c_2j+1) eps_j eps_j^T``.
    The outer sums (full covariance, never split) draw each chunk whole and
    add all three sums from it by matrix products.
    """
    linear, square, outer, unit = coefficients
    antithetic = members.antithetic
    if antithetic and summed.shape[0] % 2 == 0:  # both members of a pair share eps (and |eps|)
        first, second = summed[0::2], summed[1::2]
        linear = linear[first] - linear[second]
        square, outer, unit = (None if c is None else c[first] + c[second] for c in (square, outer, unit))
        indices = population.noise_index(first, antithetic)
    else:
        linear = linear[summed] * population.noise_sign(summed, antithetic)
        square, outer, unit = (None if c is None else c[summed] for c in (square, outer, unit))
        indices = population.noise_index(summed, antithetic)
    size = members.dim if size is None else size

    def chunk_sums(chunk):
        chunk_linear, chunk_square, chunk_outer, chunk_unit, chunk_indices = chunk
        if chunk_outer is not None:
            eps = members.noise_rows(chunk_indices).astype(chunk_outer.dtype)
            if chunk_unit is not None:
                chunk_outer = chunk_outer + chunk_unit / jnp.sum(eps * eps, axis=1)
            return (*weighted_sums(chunk_linear, chunk_square, eps), outer_sum(chunk_outer, eps))
        keys = members.noise_keys(chunk_indices)
        return (*members.noise.sums(members.aux, keys, chunk_linear, chunk_square, members.layout, start, size),
                None)

    zeros = jnp.zeros((size,), linear.dtype)
    init = (zeros, None if square is None else zeros, None if outer is None else jnp.zeros((size, size), linear.dtype))
    return Sums(*sum_in_batches(chunk_sums, (linear, square, outer, unit, indices), batch, init))
