"""The generations of ``es.minimize``, with bounds, constraints, integer variables or noise when asked: host-side
layers around ``es.engine.loop.Loop``, one generation per call, for every kind of objective (with no
option asked for, every layer is the identity and a generation is ask, evaluate, tell).

A generation reads top to bottom:

1. the asked members, as flat float64 rows (genotypes ``x``, ``ravel_pytree`` order);
2. their phenotypes: the box map of ``es.blackbox.bounds`` on the continuous coordinates, the integer ones
   rounded into their bounds (``es.blackbox.integers``): what ``fun`` and ``g`` see, and all they ever see;
3. ``fun`` on them (a JAX function: one jitted ``jax.vmap`` per popsize; a Python callable: member by member,
   stopping at the budget or the target; an ``es.HostFitness``: ``evaluate_batch``, one dispatch), ``g`` too
   (``es.blackbox.constraints``), and with ``noisy`` a few members again (``es.blackbox.uncertainty``);
4. what the strategy ranks: ``f``, plus the bound penalty, plus the augmented Lagrangian's penalty;
5. ``Loop.step``, sigma increased by noise's factor before the next members; then the Lagrangian's and the
   penalty's updates.

The best point is tracked on the phenotypes: the best feasible one by ``f`` (``fun``'s value) and, while
none is feasible, the least violating one; with ``noisy``, each run's final mean evaluated again
(``uncertainty.FINAL_EVALUATIONS`` times) competes by its mean value.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from es import validation
from es.blackbox import bounds, constraints, integers, objective, uncertainty
from es.engine.stopping import CRITERIA
from es.parallel.mesh import POPULATION_AXIS
from es.strategies import CMAES, SepCMAES
from es.strategies.margin import attached
from es.strategies.recombination import positive_weights

PyTree = Any
STAGNATION = 1 << CRITERIA.index("stagnation")
"""Not a reason to stop with constraints: the ranked function changes with the Lagrangian (pycma's
``fmin_con2`` turns ``tolstagnation`` off too)."""


class Options(NamedTuple):
    """What ``es.minimize`` was asked for, checked: ``box`` (the continuous coordinates' bounds, integer ones
    open), ``constraints`` (``g``) and its kind (``"jax"`` or ``"python"``), ``integers``, ``noisy``."""

    box: bounds.Box | None = None
    constraints: Callable | None = None
    constraint_kind: str | None = None
    integers: integers.Integers | None = None
    noisy: bool = False


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


@functools.partial(jax.jit, static_argnums=0)
def _vmapped(fun: Callable, points: PyTree) -> jax.Array:
    return jax.vmap(fun)(points)


def _violating_rank(violation: float, value: float) -> tuple[float, float]:
    """How an infeasible point ranks: the smaller violation, then the lower ``f`` (a NaN ``f`` last)."""
    return violation, math.inf if math.isnan(value) else value


def _batched(fun: Callable, points: PyTree) -> jax.Array:
    """``fun`` on every row of ``points`` (numpy, a leading member axis), one jitted ``jax.vmap``, the members
    sharded over the most local devices that divide their number (no collective: each device its rows)."""
    count = jax.tree.leaves(points)[0].shape[0]
    devices = jax.local_devices()
    used = max(n for n in range(1, len(devices) + 1) if count % n == 0)
    if used == 1:
        return _vmapped(fun, jax.device_put(points))  # a transfer (jnp.asarray would compile a program per shape)
    sharding = NamedSharding(jax.sharding.Mesh(devices[:used], (POPULATION_AXIS,)), P(POPULATION_AXIS))
    return _vmapped(fun, jax.device_put(points, sharding))


class Layers:
    """One ``es.minimize`` call's layers (``Options``), and what they keep across its runs."""

    def __init__(self, options: Options, fun, kind: str, x0: PyTree, seed: int):
        if kind == "host" and fun.stateful:
            raise ValueError("es.minimize(fun=es.HostFitness(..., init=...)): es.minimize evaluates fn(params, seed) "
                             "-> float; a stateful host fitness (init/update/stats) is for es.evolve and es.run. Make "
                             "it stateless (no init, update or stats).")
        self.options, self.fun, self.kind, self.flat = options, fun, kind, Flat(x0)
        self.rng = np.random.default_rng([seed, 44])
        self.lagrangian = constraints.Lagrangian()
        self.ngev, self.g_count = 0, None
        self.least = (math.inf, None, math.nan)  # (violation, phenotype row, f) while nothing is feasible
        self.candidates: list[tuple[float, float, np.ndarray]] = []  # noisy: (violation, mean value, phenotype)
        self.penalty, self.noise = bounds.Penalty(), uncertainty.Noise()

    # ------------------------------------------------------------------ a run

    def strategy(self, strategy):
        """The run's strategy: with integer variables, the margin attached."""
        integer = self.options.integers
        return strategy if integer is None else attached(strategy, integers.margin(integer))

    def genotype(self, x0: PyTree) -> PyTree:
        """The first mean: the preimage of ``x0`` under the box map."""
        box = self.options.box
        return x0 if box is None else self.flat.tree(bounds.inverse(box, self.flat.row(x0)))

    def cost(self, popsize: int) -> int:
        """Evaluations a generation may need, and those kept back for the final means."""
        again = math.ceil(2 + popsize / 20) if self.options.noisy else 0
        whole = 1 if self.kind == "python" else popsize
        return whole + again + (uncertainty.FINAL_EVALUATIONS if self.options.noisy else 0)

    def start_run(self) -> None:
        self.penalty, self.noise = bounds.Penalty(), uncertainty.Noise()

    def limited(self, state):
        """A run's first ``state`` with its standard deviations within a third of the box's widths
        (``bounds.into_limits``; CMA-ES's and sep-CMA-ES's), or ``state`` itself where none exceeds them or
        there is no box."""
        box = self.options.box
        limited = None if box is None else bounds.into_limits(box, state)
        return state if limited is None else limited

    def phenotypes(self, rows: np.ndarray) -> np.ndarray:
        """What ``fun`` sees of genotypes ``rows`` (float64[k, n])."""
        box, integer = self.options.box, self.options.integers
        points = rows if box is None else bounds.transform(box, rows)
        return points if integer is None else integers.rounded(integer, np.where(
            np.isin(np.arange(rows.shape[1]), integer.indices), rows, points))

    # ------------------------------------------------------------------ a generation

    def generation(self, owner, strategy, loop, index: int, left: float):
        """One generation (``minimize``'s step for options): ``(loop, 1, stop)``."""
        del left
        genotypes = self.flat.rows(loop.members)
        points = self.phenotypes(genotypes)
        f, g = self.evaluate(owner, points, strategy.popsize)
        ranked = np.array(f, copy=True)
        if self.options.noisy and not owner.reached_target():
            self.measure_noise(owner, points, f)
        if self.options.box is not None and self.options.box.method == "penalty":
            ranked = ranked + bounds.penalties(self.options.box, self.penalty, genotypes)
        if g is not None:
            ranked = ranked + constraints.penalties(self.lagrangian, g)
        if self.options.integers is not None:  # integer centering: what the update adds to its sums
            loop.state = integers.centered(self.options.integers, strategy, loop.state, genotypes, ranked)
        factor = uncertainty.sigma_factor(self.noise, genotypes.shape[1]) if self.options.noisy else 1.0
        (_, sigma, stop), loop.members = loop.step(ranked, factor)  # the next members drawn with sigma x factor
        self.after(loop, strategy, genotypes, (f, g, ranked))
        feasible = f if g is None else np.where(constraints.violations(g) == 0, f, np.nan)
        generation_best = float(np.nanmin(feasible)) if np.any(np.isfinite(feasible)) else math.nan
        owner.record(owner.best, sigma, generation_best, strategy.popsize, index)
        if g is not None:
            stop &= ~STAGNATION
        return loop, 1, owner.stop_text(strategy, stop)

    def evaluate(self, owner, points: np.ndarray, popsize: int):
        """``(f, g)`` of the phenotypes ``points`` (float[P], float[P, m] or ``None``): NaN for members the
        budget or the target left out. Counts the evaluations and tracks the best point."""
        f = np.full(popsize, np.nan)
        g = None if self.options.constraints is None else np.full((popsize, self.g_count or 1), np.nan)
        if self.kind != "python":
            f[:] = self.values(points, owner.nit)
            owner.nfev += popsize
            if g is not None:
                g = self.constraint_values(points)
            for i in range(popsize):
                self.consider(owner, points[i], f[i], None if g is None else g[i])
            return f, g
        if g is not None and self.options.constraint_kind == "jax":
            g = self.constraint_values(points)
        kept = uncertainty.FINAL_EVALUATIONS if self.options.noisy else 0  # for the run's final mean
        for i in range(min(popsize, owner.max_evals - owner.nfev - kept)):
            f[i] = objective.value_of(self.fun, self.flat.tree(points[i]), f"for member {i} of generation {owner.nit}")
            owner.nfev += 1
            if g is not None and self.options.constraint_kind == "python":
                g = self.python_constraints(g, i, points[i])
            self.consider(owner, points[i], f[i], None if g is None else g[i])
            if owner.reached_target():
                break
        return f, g

    def values(self, points: np.ndarray, generation: int) -> np.ndarray:
        """``fun`` on the rows ``points`` at once (a JAX function or an ``es.HostFitness``), float64."""
        trees = self.flat.tree(points)
        if self.kind == "jax":
            return np.asarray(_batched(self.fun, trees), np.float64)
        seeds = self.rng.integers(0, 2**32, size=points.shape[0], dtype=np.uint32)
        values = np.asarray(self.fun.evaluate_batch(trees, seeds), np.float64)
        if values.shape != (points.shape[0],):
            raise TypeError(f"es.minimize: the es.HostFitness returned {values.shape} values for "
                            f"{points.shape[0]} members in generation {generation}.")
        return values

    def constraint_values(self, points: np.ndarray) -> np.ndarray:
        """``g`` of every row of ``points``: float64[k, m] (checked)."""
        if self.options.constraint_kind == "jax":
            out = np.asarray(_batched(self.options.constraints, self.flat.tree(points)))
            g = np.stack([constraints.checked_values(row, self.g_count, "for a member") for row in out])
        else:
            g = np.stack([constraints.checked_values(self.options.constraints(self.flat.tree(row)), self.g_count,
                                                     "for a member") for row in points])
        self.g_count = g.shape[1]
        self.ngev += points.shape[0]
        return g

    def python_constraints(self, g: np.ndarray, i: int, point: np.ndarray) -> np.ndarray:
        """``g`` with row ``i`` filled by the Python constraint function at ``point`` (resized at its first call)."""
        values = constraints.checked_values(self.options.constraints(self.flat.tree(point)), self.g_count,
                                            f"for member {i}")
        self.ngev += 1
        if self.g_count is None:
            self.g_count = values.size
            g = np.full((g.shape[0], values.size), np.nan)
        g[i] = values
        return g

    def consider(self, owner, point: np.ndarray, value: float, g: np.ndarray | None) -> None:
        """Track the best feasible phenotype (``owner.best``, ``owner.best_x``) and the least violating one."""
        violation = 0.0 if g is None else float(constraints.violations(g))
        if violation == 0.0:
            if value < owner.best:
                owner.best, owner.best_x = float(value), self.flat.tree(np.array(point))
        elif self.least[1] is None or _violating_rank(violation, value) < _violating_rank(self.least[0], self.least[2]):
            self.least = (violation, np.array(point), float(value))

    # ------------------------------------------------------------------ after the evaluations

    def measure_noise(self, owner, points: np.ndarray, f: np.ndarray) -> None:
        """Evaluate a few members again (budget permitting) and update the noise measure. The strategy ranks
        the first values: ranking a re-evaluated member by its mean solved fewer bbob-noisy problems."""
        index = uncertainty.reevaluated(f, self.rng)
        room = owner.max_evals - owner.nfev - uncertainty.FINAL_EVALUATIONS
        if index.size == 0 or index.size > room or not np.all(np.isfinite(f[index])):
            return
        if self.kind == "python":
            again = np.array([objective.value_of(self.fun, self.flat.tree(points[i]), "evaluated again")
                              for i in index])
        else:
            again = self.values(points[index], owner.nit)
        owner.nfev += index.size
        self.noise = uncertainty.measured(self.noise, f, again, index)

    def after(self, loop, strategy, genotypes: np.ndarray, evaluated: tuple) -> None:
        """The updates after ``Loop.step``: the Lagrangian and the bound penalty's weights (noise's sigma increase
        is ``Loop.step``'s ``sigma_factor``)."""
        f, g, ranked = evaluated
        n = genotypes.shape[1]
        if g is not None and np.any(np.isfinite(ranked)):
            al = constraints.started(self.lagrangian, f, g, n)
            best = int(np.nanargmin(ranked))
            if np.isfinite(f[best]):
                al = constraints.updated(al, g[best], constraints.penalised(self.lagrangian, g), n)
            self.lagrangian = al
        box = self.options.box
        if box is not None and box.method == "penalty":
            mean = self.flat.row(loop.state.params)
            self.penalty = bounds.penalty_update(box, self.penalty, f, genotypes, mean,
                                                 positive_weights(strategy.popsize)[1])

    # ------------------------------------------------------------------ the end of a run, and of the call

    def end_run(self, owner, loop) -> None:
        """With ``noisy``: evaluate the run's final mean again and keep it as a candidate for ``result.x``; where
        that mean breaks a constraint, the best feasible point found so far instead (one evaluation of it is
        all the call has: its estimate, not that value, then competes)."""
        if not self.options.noisy:
            return
        count = min(uncertainty.FINAL_EVALUATIONS, owner.max_evals - owner.nfev)
        if count < 1:
            return
        point = self.phenotypes(self.flat.row(loop.state.params)[None])
        violation = 0.0 if self.options.constraints is None else float(
            constraints.violations(self.constraint_values(point))[0])
        if violation > 0.0 and owner.best_x is not None:
            point, violation = self.flat.row(owner.best_x)[None], 0.0
        if self.kind == "python":
            values = [objective.value_of(self.fun, self.flat.tree(point[0]), "at a run's final mean")
                      for _ in range(count)]
        else:
            values = self.values(np.repeat(point, count, axis=0), owner.nit)
        owner.nfev += count
        self.candidates.append((violation, uncertainty.estimate(values), point[0]))

    def outcome(self, owner) -> tuple[PyTree, float, bool, float]:
        """``(x, fun, feasible, violation)`` of the call's result (``x``: ``None`` when nothing was evaluated)."""
        if self.candidates:
            violation, value, point = min(self.candidates, key=lambda c: c[:2])
            if violation == 0.0 or owner.best_x is None:
                return self.flat.tree(point), value, violation == 0.0, violation
        if owner.best_x is not None or self.options.constraints is None:
            return owner.best_x, float(owner.best), True, 0.0
        violation, point, value = self.least
        return (None if point is None else self.flat.tree(point)), value, False, violation


# --------------------------------------------------------------------------- checks, before anything runs


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
