"""A run's final params file, ``params.npz``: the mean params and the best member's params, one ``.npz``.

Every leaf of ``params`` is the array ``"params" + keystr(path)`` (e.g. ``params['w']``, or ``params``
when the params are a single array), with the leaf's own shape and dtype, copied to the host; every
leaf of ``best_params`` (the best member seen) likewise under ``"best_params" + keystr(path)``. The
run writes it when it completes, atomically; ``load_params`` rebuilds the pytree.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from es.runs import storage
from es.runs.host_arrays import to_numpy

PyTree = Any


def save_params(path: str | os.PathLike, params: PyTree, best_params: PyTree) -> None:
    """Write ``params`` and ``best_params`` to one ``.npz`` file, atomically (``RunDirError`` if it cannot).

    Keys are ``"params" + keystr(path)`` (e.g. ``params['w']``, or ``params``
    for a bare array) and likewise ``best_params...``.
    """
    path = pathlib.Path(path)
    arrays = {}
    for prefix, tree in (("params", params), ("best_params", best_params)):
        for leaf_path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            arrays[prefix + jax.tree_util.keystr(leaf_path)] = to_numpy(leaf)
    storage.write_atomically(path, lambda f: np.savez(f, **arrays))


def load_params(path: str | os.PathLike, like: PyTree = None, best: bool = False) -> PyTree:
    """Params written by ``save_params`` (a run's ``params.npz``).

    Args:
      path: the ``.npz`` file.
      like: a pytree of the params' structure (e.g. ``task.init_params(key)``);
        ``None`` returns a dict ``keystr(path) -> array`` (or the array itself
        when the params are a single array).
      best: load ``best_params`` (the best member seen) instead of the mean.
    """
    prefix = "best_params" if best else "params"
    with np.load(path) as data:
        arrays = {name[len(prefix):]: data[name] for name in data.files if name.startswith(prefix)}
    if like is None:
        return arrays[""] if list(arrays) == [""] else arrays
    flat, treedef = jax.tree_util.tree_flatten_with_path(like)
    missing = [jax.tree_util.keystr(p) for p, _ in flat if jax.tree_util.keystr(p) not in arrays]
    if missing or len(flat) != len(arrays):
        raise ValueError(
            f"{path} does not hold params of the structure of `like`: it has {sorted(arrays)}, "
            f"`like` has {[jax.tree_util.keystr(p) for p, _ in flat]}."
        )
    return treedef.unflatten([jnp.asarray(arrays[jax.tree_util.keystr(p)]) for p, _ in flat])
