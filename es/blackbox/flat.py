"""``x0``'s layout in es.minimize: a pytree of arrays as flat float64 rows (``ravel_pytree`` order) and back,
in numpy (what the host-side layers, the objective and the result work on)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

PyTree = Any


class Flat:
    """``x0``'s layout: flat float64 rows (``ravel_pytree`` order) to pytrees of numpy arrays and back."""

    def __init__(self, x0: PyTree):
        leaves, self.treedef = jax.tree.flatten(x0)
        self.bare = jax.tree_util.treedef_is_leaf(self.treedef)  # x0 is one array: its rows need no pytree
        self.shapes = [np.shape(leaf) for leaf in leaves]
        self.ends = np.cumsum([int(np.prod(shape)) for shape in self.shapes])[:-1]

    def rows(self, tree: PyTree) -> np.ndarray:
        """float64[k, n] of a pytree with a leading member axis."""
        leaves = [np.asarray(leaf, np.float64) for leaf in jax.tree.leaves(tree)]
        return np.concatenate([leaf.reshape(leaf.shape[0], -1) for leaf in leaves], axis=1)

    def row(self, point: PyTree) -> np.ndarray:
        """float64[n] of one point (a pytree like ``x0``)."""
        return self.rows(jax.tree.map(lambda a: np.asarray(a)[None], point))[0]

    def tree(self, rows: np.ndarray) -> PyTree:
        """The pytree of ``rows`` (float[n]: one point; float[k, n]: a leading member axis)."""
        if self.bare:  # x0 an array (this runs once per member evaluated)
            return rows.reshape(rows.shape[:-1] + self.shapes[0])
        if len(self.shapes) == 1:  # one array in a container: no split
            return jax.tree.unflatten(self.treedef, [rows.reshape(rows.shape[:-1] + self.shapes[0])])
        parts = np.split(rows, self.ends, axis=-1)
        return jax.tree.unflatten(self.treedef, [p.reshape(rows.shape[:-1] + s) for p, s in zip(parts, self.shapes)])
