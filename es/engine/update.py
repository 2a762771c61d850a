"""``exchange="sharded"`` with a coordinatewise strategy: each device updates its own slice of the coordinates.

The strategy's update then runs on ``S = slice_size(D, n, BLOCK)``
coordinates per device instead of all ``D`` on every device (``Partition``:
device ``d`` works on ``[start_d, start_d + S)``), and so do the finite
check and the best member. Per generation, after the fitnesses are exchanged::

    device d:  sums of its slice  ->  strategy.for_slice(D).update on its slice  ->  new slice
               block sums of the direction, the step and the params   --all-gather-->  the norms, the finite check
               new slice of the mean (and of every shared per-coordinate leaf, SNES's sigma)  --all-gather-->  whole

Between generations the scan carries, on each device, the whole mean and
the state that ``scale`` and ``coefficients`` read (replicated, as in every
mode), and only its slice of the rest: the ``private_state`` fields (an
optimizer's moments) and ``best_params``, as flat ``[S]`` vectors. ``split``
makes that carry from a replicated ``State`` at the start of an ``evolve``
call and ``join`` gathers it back at the end, so callers only ever see
replicated states.

Where this path ``applies`` (a coordinatewise strategy, more than
``noise.MIN_SLICE`` params) every mode and mesh runs it, on all ``D``
coordinates where nothing is split: the step compiled ``apart`` and every
norm summed in an order fixed by ``D`` (``es.coordinates``), so that
``"sharded"`` on any mesh has the bits of ``"fitness"`` on one device.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from es.engine import partition as coordinates
from es.engine import members as population
from es.noise import sources as noise_lib
from es.engine.partition import Partition
from es.strategies.base import State, Strategy

PyTree = Any

NORM_VECTORS = 4  # block sums gathered per generation: the direction, the step, the new and the old mean


def applies(strategy: Strategy, dim: int) -> bool:
    """Whether a run's update takes this module's path (in every mode and on every mesh, so that they agree):
    a coordinatewise strategy, noise that can be sliced (not low-rank), and more than ``noise.MIN_SLICE``
    params, so that some mesh can split them.

    Smaller params keep the engine's replicated update, whose bits are those of runs recorded before the
    split update existed (every policy in experiments/configs).
    """
    return strategy.coordinatewise and strategy.noise.sliceable and dim > noise_lib.MIN_SLICE


# --------------------------------------------------------------------------- per-coordinate leaves


def _coordinate_test(params: PyTree) -> Callable[[Any], bool]:
    """Whether a node of a strategy state holds one value per coordinate: a subtree shaped like ``params``, or
    a ``float[D]`` vector (ravel order)."""
    leaves, treedef = jax.tree.flatten(params)
    shapes = [jnp.shape(leaf) for leaf in leaves]
    dim = sum(int(jnp.size(leaf)) for leaf in leaves)

    def is_coordinates(node) -> bool:
        node_leaves, node_def = jax.tree.flatten(node)
        if node_def == treedef and [jnp.shape(x) for x in node_leaves] == shapes:
            return True
        return jax.tree_util.treedef_is_leaf(node_def) and node_leaves != [] and jnp.shape(node_leaves[0]) == (dim,)

    return is_coordinates


def map_coordinates(fn: Callable[[jax.Array], jax.Array], tree: PyTree, params: PyTree) -> PyTree:
    """``tree`` with every per-coordinate node replaced by ``fn(its raveled float[D] vector)``."""
    is_coordinates = _coordinate_test(params)
    return jax.tree.map(lambda node: fn(ravel_pytree(node)[0]) if is_coordinates(node) else node, tree,
                        is_leaf=is_coordinates)


def unmap_coordinates(flat_tree: PyTree, template: PyTree, params: PyTree) -> PyTree:
    """The inverse of ``map_coordinates`` (with ``fn`` the identity): raveled nodes back in ``template``'s shapes."""
    is_coordinates = _coordinate_test(params)
    return jax.tree.map(lambda node, flat: ravel_pytree(node)[1](flat) if is_coordinates(node) else flat,
                        template, flat_tree, is_leaf=is_coordinates)


def _fields(strategy: Strategy, strategy_state) -> tuple[dict, dict]:
    """``(private, shared)``: the strategy state's fields split by ``strategy.private_state``."""
    if not strategy.private_state:
        return {}, {"": strategy_state}
    values = strategy_state._asdict()
    private = {name: values[name] for name in strategy.private_state}
    return private, {name: value for name, value in values.items() if name not in private}


def _merge(strategy: Strategy, template, private: dict, shared: dict):
    if not strategy.private_state:
        return shared[""]
    return type(template)(**private, **shared)


def gathered_bytes(strategy: Strategy, state: State, part: Partition) -> tuple[int, int]:
    """Bytes crossing devices ``(every generation, once at the end of a call)`` besides the fitnesses: the
    slices of the mean and of the shared per-coordinate leaves, the norms' block sums and the finite flag
    (``update``); the slices of the private leaves and of the best params (``join``)."""

    def itemsizes(tree) -> int:
        found = []
        map_coordinates(lambda flat: found.append(flat.dtype.itemsize) or flat, tree, state.params)
        return sum(found)

    private, shared = _fields(strategy, state.strategy_state)
    params = ravel_pytree(state.params)[0].dtype.itemsize
    best = ravel_pytree(state.best_params)[0].dtype.itemsize
    n, size = part.num_devices, part.size
    norms = 4 * n * (NORM_VECTORS * part.blocks_per_slice + 1)
    return n * size * (params + itemsizes(shared)) + norms, n * size * (itemsizes(private) + best)


# --------------------------------------------------------------------------- the carry


def run_split(strategy: Strategy, state: State, part: Partition, axis, run: Callable, batched: bool = False,
              gather: bool = True):
    """``run(carry) -> (carry, metrics)`` (the scan of generations) on this device's carry.

    ``split`` first, ``join`` after unless ``gather`` is false; ``batched``:
    ``state`` holds several runs along a leading axis (``es.evolve_many``).
    """
    device = jax.lax.axis_index(axis)

    def to_carry(one):
        return split(strategy, one, part, device)

    def from_carry(carry, one):
        return join(strategy, carry, one, part, axis)

    if batched:
        to_carry, from_carry = jax.vmap(to_carry), jax.vmap(from_carry)
    carry, metrics = run(to_carry(state))
    return (from_carry(carry, state) if gather else carry), metrics


def split(strategy: Strategy, state: State, part: Partition, device: jax.Array) -> State:
    """The carry of ``device`` from a replicated ``state``: its slices of the private fields and best params."""
    start = part.start(device)

    def cut(flat):
        return jax.lax.dynamic_slice(flat, (start,), (part.size,))

    private, shared = _fields(strategy, state.strategy_state)
    private = {name: map_coordinates(cut, value, state.params) for name, value in private.items()}
    return state._replace(strategy_state=_merge(strategy, state.strategy_state, private, shared),
                          best_params=cut(ravel_pytree(state.best_params)[0]))


def join(strategy: Strategy, carry: State, template: State, part: Partition, axis) -> State:
    """The replicated ``State`` from the carry: private fields and best params all-gathered (``template``: the
    state ``split`` was given, for the shapes)."""

    def whole(flat):
        return part.assemble(jax.lax.all_gather(flat, axis, tiled=True))

    private, shared = _fields(strategy, carry.strategy_state)
    private_template, _ = _fields(strategy, template.strategy_state)
    private = {name: unmap_coordinates(map_coordinates(whole, value, carry.best_params), private_template[name],
                                       template.params) for name, value in private.items()}
    best = ravel_pytree(template.best_params)[1](whole(carry.best_params))
    return carry._replace(strategy_state=_merge(strategy, carry.strategy_state, private, shared), best_params=best)


# --------------------------------------------------------------------------- one generation's update


def update(strategy: Strategy, part: Partition, axis, members: population.Generation, state: State,
           coefficients, sums, any_valid: jax.Array, track_best: Callable):
    """Step 5 and the best member of a generation, for a coordinatewise strategy, on this device's slice.

    With ``part.split`` the carry (``split``) holds this device's slices of
    the private state and best params, ``sums`` are the slice's, and the new
    slices of the mean and shared state are all-gathered. Otherwise (one
    device, ``exchange="fitness"``, or too few params to split) it is the
    same code on all ``D`` coordinates of a replicated state, with no
    collective: every mesh and mode then runs the strategy's arithmetic
    compiled apart (``es.coordinates.apart``), since XLA fuses multiplies
    into adds (FMA) as its fusions allow, and the bits would otherwise
    follow the surrounding program.
    ``track_best(member_params)`` is the engine's best-member update, given a
    function from a member's index to its params (here: its slice of them).

    Returns ``(params, strategy_state, (best_params, best_fitness), norms)``
    as the next carry holds them, with ``norms`` the metrics ``grad_norm``,
    ``update_norm`` and ``params_norm``.
    """
    sliced = part.split
    device = jax.lax.axis_index(axis) if sliced else 0
    start, size = part.start(device), part.size
    flat, unravel = ravel_pytree(state.params)

    def cut(vector):
        return jax.lax.dynamic_slice(vector, (start,), (size,)) if sliced else vector

    def whole(vector):
        return part.assemble(jax.lax.all_gather(vector, axis, tiled=True)) if sliced else vector

    # The slice's state: per-coordinate leaves as flat vectors of the slice (the private ones are already).
    private, shared = _fields(strategy, state.strategy_state)
    if not sliced:
        private = {name: map_coordinates(cut, value, state.params) for name, value in private.items()}
    shared_slices = {name: map_coordinates(cut, value, state.params) for name, value in shared.items()}
    old_params = cut(flat)
    view = _merge(strategy, state.strategy_state, private, shared_slices)
    new_params, new_view, vectors = coordinates.apart(
        strategy.for_slice(part.dim).update, state._replace(params=old_params, strategy_state=view), coefficients,
        sums)

    # Finite everywhere, on every device (each checks its slice): the update is kept or dropped as a whole.
    finite = coordinates.all_finite((new_params, new_view))
    normed = [ravel_pytree(v)[0] for v in (vectors["grad_norm"], vectors["update_norm"], new_params, old_params)]
    if sliced:
        block_sums = [part.owned_block_sums(device, v) for v in normed]
        gathered = jax.lax.all_gather(jnp.concatenate([*block_sums, finite[None].astype(jnp.float32)]), axis)
        finite = jnp.all(gathered[:, -1] > 0)
        width = part.blocks_per_slice
        block_sums = [gathered[:, k * width:(k + 1) * width].reshape(-1) for k in range(NORM_VECTORS)]
    else:
        block_sums = [coordinates.block_square_sums(v) for v in normed]
    grad, step, new_norm, old_norm = (coordinates.norm_from_block_sums(b, part.dim) for b in block_sums)
    keep = jnp.logical_and(any_valid, finite)
    norms = {"grad_norm": grad, "update_norm": step, "params_norm": jnp.where(keep, new_norm, old_norm)}
    new_params, new_view = jax.tree.map(lambda a, b: jnp.where(keep, a, b), (new_params, new_view),
                                        (old_params, view))

    # The best member so far (this device's slice of it).
    unravel_best = ravel_pytree(state.best_params)[1] if not sliced else (lambda x: x)
    best = track_best(lambda member: unravel_best(members.member_coordinates(member, start, size)))

    # The next generation evaluates with the whole mean and the shared state: gather their slices.
    new_private, new_shared = _fields(strategy, new_view)
    new_shared = {name: unmap_coordinates(map_coordinates(whole, value, old_params), shared[name], state.params)
                  for name, value in new_shared.items()}
    if not sliced:
        templates, _ = _fields(strategy, state.strategy_state)
        new_private = {name: unmap_coordinates(value, templates[name], state.params)
                       for name, value in new_private.items()}
    return unravel(whole(new_params)), _merge(strategy, state.strategy_state, new_private, new_shared), best, norms
