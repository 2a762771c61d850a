"""What an ``es.minimize`` call asked for (``bounds``, ``constraints``, ``integer_variables``, ``noisy``), checked
before anything runs: each mistake a clear error naming the argument and the fix; ``Options`` what the
generations' layers (``es.blackbox.layers``) then apply."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from es import validation
from es.blackbox import bounds, integers, objective
from es.blackbox.flat import Flat
from es.strategies import CMAES, SepCMAES

PyTree = Any


class Options(NamedTuple):
    """What ``es.minimize`` was asked for, checked: ``box`` (the continuous coordinates' bounds, integer ones
    open), ``constraints`` (``g``) and its kind (``"jax"`` or ``"python"``), ``integers``, ``noisy``."""

    box: bounds.Box | None = None
    constraints: Callable | None = None
    constraint_kind: str | None = None
    integers: integers.Integers | None = None
    noisy: bool = False


def checked(x0: PyTree, box, g, integer_variables, noisy) -> Options | None:
    """The options of an ``es.minimize`` call as ``Options`` (``None``: none asked for), or a clear error."""
    if not isinstance(noisy, (bool, np.bool_)):
        raise TypeError(f"es.minimize(noisy={noisy!r}): noisy must be True or False.")
    flat = Flat(x0)
    start = flat.row(x0)
    box = bounds.checked(box, start, functools.partial(_spread, x0, flat))
    integer = integers.checked(integer_variables, start.size, *((box.lower, box.upper) if box else (None, None)))
    if box is not None and integer is not None:  # integer coordinates are rounded into their bounds, not mapped
        opened = np.isin(np.arange(start.size), integer.indices)
        box = box._replace(lower=np.where(opened, -np.inf, box.lower), upper=np.where(opened, np.inf, box.upper))
    g, kind = (None, None) if g is None else _constraint_kind(g, x0)
    if box is None and g is None and integer is None and not noisy:
        return None
    return Options(box, g, kind, integer, bool(noisy))


def check_strategy(options: Options | None, strategy) -> None:
    """Integer variables and ``noisy`` need a CMA-ES (a margin, a global sigma): else a clear error."""
    needs = [name for name, used in (("integer_variables", options is not None and options.integers is not None),
                                     ("noisy", options is not None and options.noisy)) if used]
    if needs and not isinstance(strategy, (CMAES, SepCMAES)):
        raise ValueError(
            f"es.minimize({needs[0]}=..., strategy={type(strategy).__name__}(...)): {needs[0]} needs es.CMAES or "
            "es.SepCMAES (a margin on the integer coordinates, a global sigma for noise); leave strategy=None."
        )


def _spread(x0: PyTree, flat: Flat, value, name: str) -> np.ndarray:
    """One side of the bounds as flat float64[n]: a number, an array shaped like ``x0``, or a pytree like it."""
    size = int(sum(np.size(leaf) for leaf in jax.tree.leaves(x0)))
    try:
        if np.ndim(value) == 0 and not isinstance(value, (dict, list, tuple)):
            return np.full(size, float(value))
        if jax.tree.structure(value) == flat.treedef:
            return flat.rows(jax.tree.map(lambda a, b: np.broadcast_to(np.asarray(a, np.float64), np.shape(b))[None],
                                          value, x0))[0]
        array = np.asarray(value, np.float64)
        if len(flat.shapes) == 1:
            return np.broadcast_to(array, flat.shapes[0]).ravel()
    except (TypeError, ValueError):
        pass
    shapes = [list(s) for s in flat.shapes]
    raise ValueError(
        f"es.minimize(bounds=...): {name} must be a number or shaped like x0 (leaf shapes {shapes}), with "
        f"-np.inf / np.inf for an open side; got {value!r}."
    )


def _constraint_kind(g, x0: PyTree) -> tuple[Callable, str]:
    """``(g, "jax")`` for a ``g`` that traces, its value computed from ``x``: a number, a 1-D array, or a list or
    tuple of numbers (``g`` then wrapped in ``Stacked``, the 1-D array numpy makes of such a list, as pycma
    reads it); else ``(g, "python")`` (``objective.traced_output``)."""
    if not callable(g):
        raise TypeError(f"es.minimize(constraints={g!r}): constraints must be a callable g(x) returning the "
                        "constraint values, feasible where every value is <= 0.")
    out = objective.traced_output(g, x0)
    if out is None:  # a Python callable
        return g, "python"
    if isinstance(out, (list, tuple)) and out and all(_is_number(value) and value.shape == () for value in out):
        return Stacked(g), "jax"
    if not _is_number(out) or len(out.shape) > 1:
        got = validation.shapes(out)
        raise TypeError(f"es.minimize(constraints=g): g(x) must return a number or a 1-D array of numbers (or a list "
                        f"of numbers); for x shaped like x0 it returns {got}.")
    return g, "jax"


def _is_number(out) -> bool:
    """Whether a traced output is one array of numbers (any shape)."""
    return isinstance(out, jax.ShapeDtypeStruct) and validation.real_dtype(out.dtype)


@dataclasses.dataclass(frozen=True)
class Stacked:
    """A JAX ``g`` that returns a list or tuple of numbers, returning them as one 1-D array instead. Equal for
    the same ``g``, so a second ``es.minimize`` call with it reuses the programs of the first."""

    g: Callable

    def __call__(self, x):
        return jnp.stack([jnp.asarray(value) for value in self.g(x)])
