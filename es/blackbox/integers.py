"""Integer variables for ``es.minimize(integer_variables=[i, ...])``: ``fun`` only ever sees integral values
at those flat indices.

An integer coordinate of a member is read as ``clip(round(x_i), lo_i, hi_i)``, ``lo_i = ceil(lower_i)`` and
``hi_i = floor(upper_i)`` from ``bounds`` (unbounded without), so it is integral and inside the box whatever
the search does; the box transform of ``es.blackbox.bounds`` acts on the other coordinates only. The
search keeps moving on them with CMA-ES with margin (Hamano et al., GECCO 2022; ``es.strategies.margin``):
each integer coordinate keeps a probability of at least ``ALPHA`` of another value, ``2 Phi(-2.5)``, about
1.24%: what a standard deviation of 0.2 gives at a cell's centre, pycma's lower bound on the standard
deviation of an integer variable.

Measured on COCO's bbob-mixint against pycma (docs/guides/black-box.md): the paper's ``alpha = 1 / (n
popsize)`` shrinks with the dimension, and at D = 20 (16 integer variables) a generation then mostly samples
one plateau value, ``tolfun`` ends the run and f7 (the step ellipsoid) went unsolved where pycma solves it;
a fixed probability keeps the flips per coordinate as pycma's bound does. The usual popsize ``4 + 3 ln n``
solved more than pycma's for integer variables (``6 + 3 (ln n + ln n_int)``) at D = 5 (85.5% against 82.2%
of the targets, instances 4-6), and stays.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from es.strategies.margin import IntegerMargin


class Integers(NamedTuple):
    """The integer coordinates: flat ``indices`` (sorted) and their integer bounds ``lower``/``upper`` (float64
    arrays of those indices' values; -inf / inf where open)."""

    indices: np.ndarray
    lower: np.ndarray
    upper: np.ndarray


def checked(integer_variables, dim: int, lower: np.ndarray | None, upper: np.ndarray | None) -> Integers | None:
    """``integer_variables`` as ``Integers`` (``lower``/``upper``: the flat box, or ``None``), or a clear error:
    not integers, out of ``[-dim, dim)``, repeated, or a box side that holds no integer."""
    if integer_variables is None:
        return None
    try:
        values = list(np.asarray(integer_variables).ravel()) if not isinstance(integer_variables, (int, np.integer)) \
            else [integer_variables]
    except Exception:  # noqa: BLE001 - anything numpy cannot read is refused below
        values = [integer_variables]
    example = f"e.g. integer_variables=[0, {min(2, dim - 1)}]"
    for value in values:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(
                f"es.minimize(integer_variables={integer_variables!r}): give a list of int indices into the "
                f"flattened x0 ({dim} values), {example}; got {value!r}."
            )
    if not values:
        return None
    indices = [int(v) for v in values]
    bad = [i for i in indices if not -dim <= i < dim]
    if bad:
        raise ValueError(
            f"es.minimize(integer_variables=...): index {bad[0]} is out of range for x0's {dim} flat values "
            f"(valid: 0 to {dim - 1}, or -{dim} to -1 from the end)."
        )
    flat = [i % dim for i in indices]
    if len(set(flat)) != len(flat):
        repeated = sorted({i for i in flat if flat.count(i) > 1})
        raise ValueError(f"es.minimize(integer_variables=...): flat index {repeated[0]} is given more than once; "
                         "list each integer variable once.")
    index = np.asarray(sorted(flat), np.int64)
    lo = np.full(index.size, -np.inf) if lower is None else np.ceil(lower[index])
    hi = np.full(index.size, np.inf) if upper is None else np.floor(upper[index])
    empty = np.flatnonzero(lo > hi)
    if empty.size:
        i = int(index[empty[0]])
        raise ValueError(
            f"es.minimize(integer_variables=..., bounds=...): integer variable {i} has bounds [{float(lower[i])!r}, "
            f"{float(upper[i])!r}], which hold no integer; widen them or make it a continuous variable."
        )
    return Integers(index, lo, hi)


def rounded(integers: Integers, x: np.ndarray) -> np.ndarray:
    """``x`` (float64[..., n]) with its integer coordinates rounded into their bounds (a copy)."""
    x = np.array(x, np.float64, copy=True)
    x[..., integers.indices] = np.clip(np.round(x[..., integers.indices]), integers.lower, integers.upper)
    return x


ALPHA = math.erfc(2.5 / math.sqrt(2))  # 2 Phi(-2.5)
"""The margin's least probability of another value, per integer coordinate (module docstring)."""


def margin(integers: Integers) -> IntegerMargin:
    """The static margin of ``es.strategies.margin`` for these coordinates."""
    return IntegerMargin(tuple(int(i) for i in integers.indices), tuple(float(v) for v in integers.lower),
                         tuple(float(v) for v in integers.upper), ALPHA)
