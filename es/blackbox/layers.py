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

import functools
import math
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from es.blackbox import bounds, constraints, integers, objective, uncertainty
from es.blackbox.flat import Flat
from es.blackbox.options import Options
from es.engine.stopping import CRITERIA
from es.parallel.mesh import POPULATION_AXIS
from es.strategies.margin import attached
from es.strategies.recombination import positive_weights

PyTree = Any
STAGNATION = 1 << CRITERIA.index("stagnation")
"""Not a reason to stop with constraints: the ranked function changes with the Lagrangian (pycma's
``fmin_con2`` turns ``tolstagnation`` off too)."""


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
    if used == 1:  # numpy straight into the jitted call, which transfers it (jax.device_put first cost ~100 us
        return _vmapped(fun, points)  # more a call; jnp.asarray compiled a program per shape)
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
