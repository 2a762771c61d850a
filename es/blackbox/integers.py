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
a fixed probability keeps the flips per coordinate as pycma's bound does. The first popsize is pycma's for
integer variables, ``6 + 3 (ln n + ln n_int)`` (``popsize``): with integer centering it solved more of
bbob-mixint than the usual ``4 + 3 ln n`` (docs/benchmarks.md), which had been ahead with the margin alone
(85.5% against 82.2% of the targets at D = 5, instances 4-6).

Integer centering (Marty, Semet, Auger, Hansen & Hecht, "LB+IC-CMA-ES: two simple modifications of CMA-ES to
handle mixed-integer problems", PPSN 2024; pycma's ``cma.integer_centering``, its ``method2``): before each
update, of the members the update recombines (positive weight), an integer coordinate whose cell differs from
the mean's is moved to its cell's centre, and the bias this adds is offset by moving the coordinates that sit
in the mean's cell toward its centre (never past it). ``centered`` writes what that changes in the update's
sums into the state (``es.strategies.margin``), so that the mean, the paths and ``C`` learn from the centred
members as pycma's do; ``es.blackbox.layers`` calls it before each ``tell``. Measured on bbob-mixint
(docs/benchmarks.md).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import numpy as np

from es.strategies import cma_es, sep_cma_es
from es.strategies.margin import Centering, IntegerMargin


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
    """``x`` (float64[..., n]) with its integer coordinates rounded into their bounds (a copy); a zero is
    ``0.0``, never ``-0.0`` (``+ 0.0``)."""
    x = np.array(x, np.float64, copy=True)
    x[..., integers.indices] = np.clip(np.round(x[..., integers.indices]), integers.lower, integers.upper) + 0.0
    return x


ALPHA = math.erfc(2.5 / math.sqrt(2))  # 2 Phi(-2.5)
"""The margin's least probability of another value, per integer coordinate (module docstring)."""


def popsize(dim: int, integers: Integers) -> int:
    """``es.minimize``'s first popsize with integer variables, pycma's: ``6 + 3 (ln n + ln n_int)`` (module
    docstring)."""
    return int(6 + 3 * (math.log(dim) + math.log(integers.indices.size)))


def centered(integers: Integers, strategy, state, rows: np.ndarray, ranked: np.ndarray):
    """``state`` (an ``es.State`` of ``strategy``, ``es.CMAES`` or ``es.SepCMAES`` with a margin) with its
    ``strategy_state.centering`` set to integer centering's change of this generation's update
    (``es.strategies.margin``): call it between ``ask`` and ``tell``.

    Args:
      rows: the asked members' genotypes, float64[popsize, n] (``ravel_pytree`` order).
      ranked: what the strategy ranks, float64[popsize] (lower is better; NaN/inf rank last).
    """
    inner = state.strategy_state
    if getattr(inner, "centering", None) is None:
        raise ValueError(
            f"integers.centered: the state of {type(strategy).__name__} has no integer margin; make it with a "
            "margin attached: strategy = es.strategies.margin.attached(es.CMAES(...), integers.margin(ints)), "
            "then state = strategy.init(key, x0)."
        )
    n = rows.shape[1]
    full = isinstance(strategy, cma_es.CMAES)
    by_rank = (cma_es if full else sep_cma_es).constants(n, strategy.popsize).weights
    weights = np.maximum(_tied_weights(ranked, np.asarray(by_rank, np.float64)), 0.0)
    chosen = weights > 0
    mean = np.concatenate([np.asarray(leaf, np.float64).ravel() for leaf in jax.tree.leaves(state.params)])
    scale = float(inner.sigma) * np.asarray(inner.scaling, np.float64)  # sigma A: x - m = sigma A y
    y = (rows[chosen] - mean) / scale
    u = np.zeros_like(y)
    u[:, integers.indices] = offsets(integers, rows[chosen], mean) / scale[integers.indices]
    w = weights[chosen][:, None]
    if full:
        cross = (w * y).T @ u
        outer = cross + cross.T + (w * u).T @ u
    else:
        outer = np.sum(w * (2 * y * u + u * u), axis=0)
    dtype = inner.sigma.dtype  # host values put on the device (jnp.asarray would compile a program per shape)
    centering = Centering(jax.device_put(np.asarray(np.sum(w * u, axis=0), dtype)),
                          jax.device_put(np.asarray(outer, dtype)))
    return state._replace(strategy_state=inner._replace(centering=centering))


def offsets(integers: Integers, rows: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """What integer centering adds to each of the recombined members ``rows`` (float64[m, n]) on the integer
    coordinates (float64[m, k]): pycma's ``IntegerCentering.method2`` (module docstring), the cells read as
    ``fun`` reads them (rounded into the integer bounds)."""
    index = integers.indices
    x = rows[:, index]
    cell = np.clip(np.round(x), integers.lower, integers.upper)
    centre = np.clip(np.round(mean[index]), integers.lower, integers.upper)
    at_mean = cell == centre
    offset = cell - x  # toward each member's cell centre
    bias = np.sum(np.where(at_mean, 0.0, offset), axis=0)  # what centring the others adds, per coordinate
    room_up = np.sum(np.where(at_mean, np.maximum(offset, 0.0), 0.0), axis=0)
    room_down = np.sum(np.where(at_mean, np.minimum(offset, 0.0), 0.0), axis=0)
    share = np.zeros_like(bias)  # the fraction of the room at the mean's cell that offsets the bias
    for room in (room_up, room_down):
        opposed = bias * room < 0
        share[opposed] = np.minimum(1.0, -bias[opposed] / room[opposed])
    return np.where(at_mean, np.where(bias * offset < 0, share * offset, 0.0), offset)


def _tied_weights(ranked: np.ndarray, by_rank: np.ndarray) -> np.ndarray:
    """Each member's weight as ``es.strategies.shaping.rank_weights`` gives it (minimising): ``by_rank[k]`` for
    rank ``k``, tied members the mean of their ranks' weights, invalid ones the worst rank's."""
    valid = np.isfinite(ranked)
    if not np.any(valid):
        return np.zeros(ranked.shape)
    values = np.where(valid, ranked, np.inf)
    ordered = np.sort(values)
    below, at_or_below = np.searchsorted(ordered, values, "left"), np.searchsorted(ordered, values, "right")
    cumulative = np.concatenate([[0.0], np.cumsum(by_rank)])
    weights = (cumulative[at_or_below] - cumulative[below]) / (at_or_below - below)
    return np.where(valid, weights, by_rank[-1])


def margin(integers: Integers) -> IntegerMargin:
    """The static margin of ``es.strategies.margin`` for these coordinates."""
    return IntegerMargin(tuple(int(i) for i in integers.indices), tuple(float(v) for v in integers.lower),
                         tuple(float(v) for v in integers.upper), ALPHA)
