"""Step 5 of a generation, the one update path: the strategy's update on this device's part of the coordinates.

The coordinates are partitioned over the devices (``es.engine.partition.Partition``). Where
``exchange="sharded"`` meets a ``coordinatewise`` strategy and more than ``MIN_SLICE`` params, device
``d`` works on its slice ``[start_d, start_d + S)``; everywhere else there is one part, all ``D``
coordinates, on every device. Either way the same code runs::

    device d:  mean, per-coordinate state, sums of its part  ->  strategy.update, compiled apart  ->  new part
               block sums of the direction, the change and the mean  --all-gather (if split)-->  norms
               finite everywhere and some member valid?  ->  keep the new part, else the old one
               the best member so far (its part)
               new part of the mean and of the shared per-coordinate state  --all-gather (if split)-->  whole

The strategy's arithmetic is compiled ``apart`` (XLA contracts multiply-adds into FMAs as its fusions
allow, so the bits would otherwise follow the surrounding program) and the norms are summed by blocks in
an order fixed by ``D`` (``es.engine.partition``), so a split update on any mesh has the bits of one part
on one device.

Between generations a split run's scan carries, on each device, the whole mean and the state that
``scale`` and ``coefficients`` read (replicated), and only its slice of the ``Private`` fields of the
strategy state (an optimizer's moments) and of ``best_params``. ``split`` makes that carry from a
replicated ``State`` at the start of an ``evolve`` call and ``join`` gathers it at the end, so callers only
ever see replicated states.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from es.engine import partition
from es.engine.members import Generation
from es.engine.partition import Partition
from es.strategies.base import State, Strategy, declared_fields

PyTree = Any

NORM_VECTORS = 4  # block sums gathered per generation: the direction, the change, the new and the old mean


class Updated(NamedTuple):
    """What the update of one generation gives ``generation_step``: the next mean (a pytree, or the flat slice a
    split carry holds), strategy state, best member and fitness, and the norm metrics."""

    params: PyTree
    strategy_state: Any
    best_params: PyTree
    best_fitness: jax.Array
    norms: dict[str, jax.Array]


# --------------------------------------------------------------------------- per-coordinate fields


def _per_coordinate_leaves(fn: Callable[[jax.Array], jax.Array], value: PyTree, dim: int) -> PyTree:
    """``value`` with ``fn`` applied to every ``[D]`` leaf (the leaves a per-coordinate field holds per coordinate)."""
    return jax.tree.map(lambda leaf: fn(leaf) if jnp.shape(leaf) == (dim,) else leaf, value)


def map_declared(fn: Callable[[jax.Array], jax.Array], strategy_state, dim: int, which: str = "all"):
    """The strategy state with ``fn`` applied to the ``[D]`` leaves of its declared fields: ``"all"`` of them
    (``PerCoordinate`` and ``Private``), the ``"private"`` ones or the ``"shared"`` (``PerCoordinate``) ones."""
    per_coordinate, private = declared_fields(type(strategy_state))
    names = {"all": per_coordinate + private, "private": private, "shared": per_coordinate}[which]
    if not names:
        return strategy_state
    changed = {name: _per_coordinate_leaves(fn, getattr(strategy_state, name), dim) for name in names}
    return strategy_state._replace(**changed)


def gathered_bytes(state: State, part: Partition) -> tuple[int, int]:
    """Bytes crossing devices ``(every generation, once at the end of a call)`` besides the fitnesses, for a split
    update: the slices of the mean and of the shared per-coordinate leaves, the norms' block sums and the
    finite flag; the slices of the private leaves and of the best params (``join``)."""
    dim = part.dim

    def itemsizes(which: str) -> int:
        found = []
        map_declared(lambda leaf: found.append(leaf.dtype.itemsize) or leaf, state.strategy_state, dim, which)
        return sum(found)

    params = ravel_pytree(state.params)[0].dtype.itemsize
    best = ravel_pytree(state.best_params)[0].dtype.itemsize
    n, size = part.num_devices, part.size
    norms = 4 * n * (NORM_VECTORS * part.blocks_per_slice + 1)
    return n * size * (params + itemsizes("shared")) + norms, n * size * (itemsizes("private") + best)


# --------------------------------------------------------------------------- the carry of a split run


def run_split(state: State, part: Partition, axis, run: Callable, batched: bool = False, gather: bool = True):
    """``run(carry) -> (carry, metrics)`` (the scan of generations) on this device's carry.

    ``split`` first, ``join`` after unless ``gather`` is false; ``batched``:
    ``state`` holds several runs along a leading axis (``es.evolve_many``).
    """
    if not part.split:
        return run(state)
    device = jax.lax.axis_index(axis)

    def to_carry(one):
        return split(one, part, device)

    def from_carry(carry, one):
        return join(carry, one, part, axis)

    if batched:
        to_carry, from_carry = jax.vmap(to_carry), jax.vmap(from_carry)
    carry, metrics = run(to_carry(state))
    return (from_carry(carry, state) if gather else carry), metrics


def split(state: State, part: Partition, device: jax.Array) -> State:
    """The carry of ``device`` from a replicated ``state``: its slices of the private fields and best params."""
    def cut(flat):
        return jax.lax.dynamic_slice(flat, (part.start(device),), (part.size,))

    return state._replace(strategy_state=map_declared(cut, state.strategy_state, part.dim, "private"),
                          best_params=cut(ravel_pytree(state.best_params)[0]))


def join(carry: State, template: State, part: Partition, axis) -> State:
    """The replicated ``State`` from the carry: private fields and best params all-gathered (``template``: the
    state ``split`` was given, for the shapes)."""
    def whole(flat):
        return part.assemble(jax.lax.all_gather(flat, axis, tiled=True))

    private = map_declared(whole, carry.strategy_state, part.size, "private")
    best = ravel_pytree(template.best_params)[1](whole(carry.best_params))
    return carry._replace(strategy_state=private, best_params=best)


# --------------------------------------------------------------------------- one generation's update


def apply(strategy: Strategy, hp, part: Partition, axis, members: Generation, state: State, coefficients, sums,
          fitness: jax.Array, valid: jax.Array, ranked: jax.Array) -> Updated:
    """The strategy's update on this device's part of the coordinates, the norms and the best member.

    ``fitness`` are the generation's values (what the best member reports),
    ``ranked`` the same shifted to full precision (what picks the best), and
    ``valid`` whether each is finite. A generation without a valid member, or
    whose update is not finite anywhere, keeps the previous mean and state.
    """
    split_run = part.split
    device = jax.lax.axis_index(axis) if split_run else 0
    start, size, dim = part.start(device), part.size, part.dim
    flat, unravel = ravel_pytree(state.params)

    def cut(vector):
        return jax.lax.dynamic_slice(vector, (start,), (size,)) if split_run else vector

    def whole(vector):
        return part.assemble(jax.lax.all_gather(vector, axis, tiled=True)) if split_run else vector

    # The part's view: the mean and the declared per-coordinate leaves (the private ones a split carry holds cut).
    view = map_declared(cut, state.strategy_state, dim, "shared" if split_run else "all")
    old_mean = cut(flat)
    step = partition.apart(strategy.update, hp, view, old_mean.astype(members.dtype), coefficients, sums,
                           state.generation)
    new_mean = step.mean.astype(flat.dtype)

    # Finite everywhere, on every device (each checks its part): the update is kept or dropped as a whole.
    finite = partition.all_finite((new_mean, step.state))
    vectors = jnp.stack([v.astype(jnp.float32) for v in (step.direction, step.change, new_mean, old_mean)])
    if split_run:
        owned = part.owned_block_sums(device, vectors).reshape(-1)
        gathered = jax.lax.all_gather(jnp.concatenate([owned, finite[None].astype(jnp.float32)]), axis)
        finite = jnp.all(gathered[:, -1] > 0)
        width = part.blocks_per_slice
        block_sums = [gathered[:, k * width:(k + 1) * width].reshape(-1) for k in range(NORM_VECTORS)]
    else:
        block_sums = list(partition.block_square_sums(vectors))
    direction, change, new_norm, old_norm = (partition.norm_from_block_sums(b, dim) for b in block_sums)
    keep = jnp.logical_and(jnp.any(valid), finite)
    new_mean, new_view = jax.tree.map(lambda a, b: jnp.where(keep, a, b), (new_mean, step.state), (old_mean, view))
    norms = {"grad_norm": direction, "update_norm": change, "params_norm": jnp.where(keep, new_norm, old_norm)}

    # The best member so far (this device's part of it).
    unravel_best = (lambda x: x) if split_run else ravel_pytree(state.best_params)[1]
    best_params, best_fitness = track_best(strategy.maximize, state, fitness, valid, ranked,
                                           lambda member: unravel_best(members.member_coordinates(member, start, size)))

    # The next generation evaluates with the whole mean and shared state: gather their new slices.
    strategy_state = map_declared(whole, new_view, size, "shared") if split_run else new_view
    return Updated(unravel(whole(new_mean)), strategy_state, best_params, best_fitness, norms)


def track_best(maximize: bool, state: State, fitness, valid, ranked, member_params: Callable):
    """The best member so far: rebuilt from its key (``member_params(index)``) when this generation beats it.

    The generation's best is picked by ``ranked`` (full precision); it
    replaces the previous best when its value is strictly better.
    """
    better = ranked if maximize else -ranked
    best = jnp.argmax(jnp.where(valid, better, -jnp.inf))
    value = fitness[best]
    previous = state.best_fitness
    improved = jnp.logical_and(valid[best], value > previous if maximize else value < previous)
    candidate = member_params(best.astype(jnp.int32))
    best_params = jax.tree.map(lambda new, old: jnp.where(improved, new, old), candidate, state.best_params)
    return best_params, jnp.where(improved, value, previous)
