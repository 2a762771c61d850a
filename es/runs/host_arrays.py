"""A state's leaves as host (numpy) arrays, with the signature and the digest a checkpoint records of them.

- ``to_numpy``: a host copy of one array (a replicated array of several processes gives its local copy).
- ``host_leaves``: every leaf of a pytree as ``(signature entry, numpy array)``; a typed PRNG key becomes
  its raw key data (``uint32``, e.g. ``[..., 2]`` for threefry).
- ``signature``: path (``keystr``), shape and dtype of every leaf; a typed key's dtype is
  ``key<impl>`` (``KEY_DTYPE_PREFIX`` + impl + ``>``) and its shape the key's own, without the data axes.
- ``digest`` / ``state_digest``: SHA-256 hex over the name, dtype, shape and bytes of every array.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any

# How a typed PRNG key's dtype begins in a signature: ``key<impl>``.
KEY_DTYPE_PREFIX = "key<"


def to_numpy(x) -> np.ndarray:
    """A host copy of ``x``; a replicated array of several processes gives its local copy."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        x = x.addressable_data(0)
    return np.asarray(x)


def _is_key(leaf) -> bool:
    return isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def host_leaves(tree: PyTree) -> list[tuple[dict, np.ndarray]]:
    """``(signature entry, numpy array)`` for every leaf; typed PRNG keys become their key data."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if _is_key(leaf):
            entry = {"shape": list(leaf.shape), "dtype": f"{KEY_DTYPE_PREFIX}{jax.random.key_impl(leaf)}>"}
            array = to_numpy(jax.random.key_data(leaf))
        else:
            array = to_numpy(leaf)
            entry = {"shape": list(array.shape), "dtype": str(array.dtype)}
        out.append(({"path": jax.tree_util.keystr(path), **entry}, array))
    return out


def signature(tree: PyTree) -> list[dict]:
    """Path, shape and dtype of every leaf of ``tree`` (keys as ``key<impl>``)."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if _is_key(leaf):
            dtype = f"{KEY_DTYPE_PREFIX}{jax.random.key_impl(leaf)}>"
        else:
            dtype = str(jnp.result_type(leaf))
        out.append({"path": jax.tree_util.keystr(path), "shape": list(jnp.shape(leaf)), "dtype": dtype})
    return out


def digest(named_arrays) -> str:
    """SHA-256 of ``(name, array)`` pairs, in order: each name, dtype, shape and C-order bytes."""
    sha = hashlib.sha256()
    for name, array in named_arrays:
        array = np.ascontiguousarray(array)
        sha.update(f"{name}|{array.dtype}|{array.shape}|".encode())
        sha.update(array.tobytes())
    return sha.hexdigest()


def state_digest(state: PyTree) -> str:
    """SHA-256 of every leaf (path, dtype, shape and bytes) of ``state``."""
    return digest((entry["path"], array) for entry, array in host_leaves(state))
