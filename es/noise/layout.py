"""The shapes of the params, as a noise source sees them: a static description of the raveled vector.

The engine works on the params raveled into one ``float32[D]`` vector
(``jax.flatten_util.ravel_pytree`` order: the leaves in ``jax.tree.leaves``
order, each raveled row-major). Full-rank noise sources only need ``D``;
low-rank noise (``es.LowRankNoise``) needs to know which stretches of that
vector are matrices. A ``Layout`` records the leaf shapes, so it is hashable
and static under ``jax.jit``::

    layout = Layout.of({"w": jnp.zeros((3, 4)), "b": jnp.zeros(4)})
    layout.dim                      # 16
    layout.offsets                  # (0, 4): "b" comes first in leaf order
    layout.matrix_shape((2, 3, 4))  # (6, 4): leading axes merged, the last kept
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import jax


@dataclasses.dataclass(frozen=True)
class Layout:
    """Static leaf shapes of a params pytree, in ``ravel_pytree`` order.

    Attributes:
      shapes: one shape tuple per leaf.
    """

    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, params: Any) -> Layout:
        """The layout of ``params`` (arrays or ``jax.ShapeDtypeStruct``s)."""
        return cls(tuple(tuple(int(d) for d in leaf.shape) for leaf in jax.tree.leaves(params)))

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(math.prod(shape) for shape in self.shapes)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Where each leaf starts in the raveled vector."""
        return tuple(itertools.accumulate(self.sizes, initial=0))[:-1]

    @property
    def dim(self) -> int:
        """``D``, the number of params."""
        return sum(self.sizes)

    @staticmethod
    def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int] | None:
        """``(m, n)``: how a leaf of ``shape`` is viewed as a matrix, or ``None`` for a vector or scalar.

        A leaf with two or more axes and at least one element is the matrix
        ``leaf.reshape(-1, shape[-1])``: every leading axis is merged into the
        rows and the last axis (a dense kernel's outputs, a conv kernel's
        output channels) gives the columns.
        """
        if len(shape) < 2 or math.prod(shape) == 0:
            return None
        return math.prod(shape[:-1]), shape[-1]
