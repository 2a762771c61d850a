"""Arrays of a run whose mesh spans processes: put on the mesh, read back as numpy, copied to one device.

``replicate`` turns each process's own copy of a state into global arrays replicated on every device of a
mesh (checking, by a 32-byte fingerprint per process, that the copies agree); ``fetch`` reads any result
back as numpy on every process; ``local_copy`` gives single-device arrays for work outside the mesh. In a
single process they are ``jax.device_put``, ``np.asarray`` and ``addressable_data(0)``. Public as
``es.distributed.replicate``, ``es.distributed.fetch`` and ``es.distributed.local_copy``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

PyTree = Any


def replicate(tree: PyTree, mesh: Mesh) -> PyTree:
    """``tree`` as arrays replicated on every device of ``mesh`` (``NamedSharding(mesh, P())``).

    On a mesh of this process's devices this is ``jax.device_put`` (global
    replicated inputs are read from a local copy). On a mesh
    spanning processes each process contributes its own copy: leaves already
    replicated on ``mesh`` (a previous ``evolve``'s results) are kept, the
    others become global arrays built from this process's values, after a
    check that every process holds the same values (a 32-byte fingerprint per
    process crosses the network once, never the arrays). Under ``jax.jit``
    (tracers) it is a sharding constraint, as ``jax.device_put``.
    """
    sharding = NamedSharding(mesh, P())
    leaves, treedef = jax.tree.flatten(tree)
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        return jax.device_put(tree, sharding)
    if sharding.is_fully_addressable:  # this process's devices: read global inputs locally
        if all(isinstance(x, jax.Array) and x.sharding == sharding for x in leaves):
            return tree  # placed so already (a previous evolve's state): what device_put returns, in a tenth the time
        local = [_process_local(x) if isinstance(x, jax.Array) else x for x in leaves]
        return jax.tree.unflatten(treedef, jax.device_put(local, sharding))
    todo = [i for i, x in enumerate(leaves) if not _is_replicated_on(x, sharding)]
    if not todo:
        return tree
    local = [_process_local(leaves[i]) for i in todo]
    _check_same_on_every_process(local)
    for i, value in zip(todo, local):
        leaves[i] = jax.make_array_from_process_local_data(sharding, value)
    return jax.tree.unflatten(treedef, leaves)


def _is_replicated_on(x, sharding: NamedSharding) -> bool:
    return isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sharding, x.ndim)


def _process_local(x):
    """A leaf as a value this process holds in full: a local array or numpy."""
    if isinstance(x, jax.Array):
        if x.is_fully_addressable:
            return x
        if x.is_fully_replicated:
            return x.addressable_data(0)
        raise ValueError(
            "es.evolve: an input array is sharded across processes (not replicated), so no process holds "
            "all of it; pass the state es.evolve returned, or arrays every process holds in full."
        )
    return np.asarray(x)


def _host_bytes(x) -> bytes:
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    array = np.asarray(x)
    return str((array.shape, array.dtype)).encode() + np.ascontiguousarray(array).tobytes()


def _check_same_on_every_process(values: list) -> None:
    from jax.experimental import multihost_utils

    digest = hashlib.sha256()
    for value in values:
        digest.update(_host_bytes(value))
    fingerprint = np.frombuffer(digest.digest(), dtype=np.uint32)
    everyone = np.asarray(multihost_utils.process_allgather(fingerprint))
    differ = [p for p in range(everyone.shape[0]) if not np.array_equal(everyone[p], everyone[0])]
    if differ:
        raise ValueError(
            f"es.evolve: processes {differ} hold a different state (params, key or optimizer state) than "
            "process 0; every process must pass the same state. Create it identically on every process "
            "(same key and params, not seeded by the process index), or pass the state a previous "
            "es.evolve returned."
        )


def fetch(tree: PyTree) -> PyTree:
    """``tree`` as numpy arrays on every process (e.g. ``evolve``'s state and metrics).

    Replicated arrays are read from a local device, without communication;
    arrays sharded across processes are all-gathered. PRNG key arrays become
    their ``uint32`` key data (``jax.random.key_data``).
    """
    return jax.tree.map(_fetch_leaf, tree)


def _fetch_leaf(x):
    if not isinstance(x, jax.Array):
        return np.asarray(x)
    if not x.is_fully_addressable:
        if x.is_fully_replicated:
            x = x.addressable_data(0)
        else:
            from jax.experimental import multihost_utils

            if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                x = jax.random.key_data(x)
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x)


def local_copy(tree: PyTree) -> PyTree:
    """``tree``'s replicated arrays as single-device arrays on this process (key types kept).

    For local work on results, e.g. evaluating ``state.params`` outside
    ``evolve`` or continuing a run with ``mesh=None``. Arrays that are sharded
    (not replicated) stay as they are when this process holds them in full;
    those sharded across processes raise ``ValueError``.
    """
    return jax.tree.map(_local_leaf, tree)


def _local_leaf(x):
    if not isinstance(x, jax.Array):
        return x
    if x.is_fully_replicated:
        return x.addressable_data(0)
    return _process_local(x)
