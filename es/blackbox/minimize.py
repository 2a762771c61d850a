"""``es.minimize``: the front door for black-box optimisation, in the spirit of ``cma.fmin2`` and
``scipy.optimize.minimize``.

    result = es.minimize(lambda x: jnp.sum((x - 1) ** 2), np.zeros(10), 0.5, max_evals=5000)
    result.x, result.fun, result.nfev, result.stop

One call runs one or more *runs* of a strategy (restarts: ``es.blackbox.restarts``), in float64
(``jax_enable_x64`` switched on for the call, ``float64``), each until it meets a stopping condition (``es.engine.stopping``), and
the whole call until ``max_evals`` (never exceeded), the ``target`` or the last run. A run reads top to
bottom:

1. a state from ``x0`` (a new key per run), the strategy resized to the run's popsize and sigma;
2. generations, one at a time, through es.engine's ask/tell loop (``es.engine.loop.Loop``: each generation's tell
   and the next ask in one compiled call) and ``es.blackbox.layers``: the members are evaluated by their
   kind (a JAX function: one jitted ``jax.vmap``; a Python callable: member by member; an
   ``es.HostFitness``: one dispatch to its workers), with the options' transformations around them;
3. after each generation: the best point so far, the budget, the target, the stopping conditions.

A run's generations (its first members and each generation's tell and next members) run one compiled
program, nothing compiled per generation count (``_Programs``; a JAX function adds its ``vmap``), and JAX's
persistent compilation cache keeps it for later processes (``es.compilation_cache``). A restart schedule's
popsizes are ``lambda_0 * 2**k`` with ``k <= MAX_RESTARTS`` (BIPOP's small runs draw from the same ones), and
with restarts one padded CMA-ES program serves two to four of them (``es.blackbox.restarts.program_popsizes``):
a call compiles at most 10 programs however many runs it makes (the README example: one, where it compiled one
per popsize), and a second call with the same shapes compiles none (tests/test_minimize.py).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import numbers
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from es import compilation_cache, validation
from es.blackbox import bounds as bounds_layer
from es.blackbox import integers, layers, objective
from es.blackbox.objective import float64
from es.blackbox.options import Options, check_strategy, checked
from es.blackbox.restarts import RESTARTS, RunSettings, Schedule, program_popsizes
from es.engine import loop, stopping
from es.noise import threefry
from es.strategies import CMAES, SepCMAES
from es.strategies.base import Strategy
from es.strategies.cma_es import MAX_DIM

PyTree = Any


class Run(NamedTuple):
    """One run of an ``es.minimize`` call (the first, or a restart).

    Attributes:
      regime: ``"first"``, ``"large"`` or ``"small"`` (``es.blackbox.restarts``).
      popsize, sigma: the run's population size and initial step size.
      nfev, nit: the evaluations and generations it used.
      fun: the best value it found.
      stop: why it ended, in words.
    """

    regime: str
    popsize: int
    sigma: float
    nfev: int
    nit: int
    fun: float
    stop: str


class MinimizeResult(NamedTuple):
    """What ``es.minimize`` returns.

    Attributes:
      x: the best point evaluated, float64, shaped like ``x0`` (a pytree if ``x0`` is one).
      fun: its value.
      nfev: evaluations used (at most ``max_evals``).
      nit: generations, over every run.
      restarts: every run (``Run``), the first included: ``len(restarts) - 1`` restarts were made.
      stop: why the call ended, in words.
      success: the target was reached (``fun <= target``), or, without a target, the last run converged
        (its scale or fitness collapsed: ``tolfun``, ``tolfunhist``, ``tolx``).
      history: per generation, numpy arrays: ``nfev`` (evaluations so far), ``fun`` (best so far),
        ``generation_fun`` (the generation's best), ``sigma`` (mean scale), ``popsize`` and ``run``.
      feasible: with ``constraints``, whether ``x`` is feasible (a feasible point was found); else True.
      violation: the largest constraint violation at ``x``, ``max(0, max_i g_i(x))`` (0.0 when feasible).
      ngev: evaluations of the constraints.

    With ``constraints``, ``x`` is the best feasible point found (none: the least violating one, ties broken
    by ``f``; a ``g`` NaN everywhere violates infinitely); with
    ``noisy``, the point with the best mean over repeated evaluations and ``fun`` that mean
    (``es.blackbox.uncertainty``).
    """

    x: PyTree
    fun: float
    nfev: int
    nit: int
    restarts: tuple[Run, ...]
    stop: str
    success: bool
    history: dict[str, np.ndarray]
    feasible: bool = True
    violation: float = 0.0
    ngev: int = 0


CONVERGED = ("tolfun", "tolfunhist", "tolx")


def minimize(
    fun: Callable | Any,
    x0: PyTree,
    sigma0: float,
    *,
    strategy: Strategy | None = None,
    max_evals: int,
    target: float | None = None,
    restarts: str | None = None,
    seed: int = 0,
    bounds=None,
    constraints: Callable | None = None,
    integer_variables=None,
    noisy: bool = False,
) -> MinimizeResult:
    """Minimise ``fun`` from ``x0`` with an evolution strategy (CMA-ES by default), with restarts.

    Args:
      fun: a JAX function of one ``x`` (evaluated inside jit, members batched
        and sharded as in ``es.evolve``), any Python callable taking a float64
        numpy array shaped like ``x0`` and returning a number (a ``cocoex``
        problem, a simulator; called in this process), or an ``es.HostFitness``
        (worker processes). See ``es.blackbox.objective``.
      x0: the initial point: an array or a pytree of arrays (finite); a list or tuple of numbers is a
        vector, as scipy and pycma take it.
      sigma0: the initial scale (> 0): about a quarter of the width of the
        region where the optimum may be.
      strategy: ``None``: ``es.CMAES`` up to ``es.strategies.cma_es.MAX_DIM``
        parameters, ``es.SepCMAES`` above, with popsize ``4 + floor(3 ln D)``
        (with ``integer_variables``, pycma's ``6 + 3 (ln D + ln D_int)``).
        Or a strategy (e.g. ``es.SNES(popsize=32)``): its popsize is the first
        run's, and ``minimize`` sets its ``sigma`` and ``maximize=False``.
      max_evals: evaluations at most (never exceeded), at least the popsize.
      target: stop once ``fun(x) <= target``.
      restarts: ``None`` (one run), ``"ipop"`` (the popsize doubles at each
        restart) or ``"bipop"`` (Hansen 2009: large runs alternate with runs
        of smaller populations and step sizes); at most 9 large restarts.
      seed: seeds every run's keys and BIPOP's draws.
      bounds: ``(lower, upper)``, each a number or an array shaped like
        ``x0`` (-inf / inf: open), or a ``scipy.optimize.Bounds``: ``fun`` is
        only called inside the box (``es.blackbox.bounds``).
      constraints: ``g(x)`` returning a number, a 1-D array or a list of
        numbers, feasible where every value is <= 0; a JAX or Python callable
        (``es.blackbox.constraints``, an augmented Lagrangian).
      integer_variables: indices into the flattened ``x``: ``fun`` sees
        integral values there (``es.blackbox.integers``: CMA-ES with margin
        and integer centering).
      noisy: uncertainty handling for a noisy ``fun``
        (``es.blackbox.uncertainty``).

    Returns:
      A ``MinimizeResult``.

    Compiled programs are kept on disk for later processes (JAX's persistent
    compilation cache, ``es.compilation_cache``: on by default in
    ``~/.cache/es/jax``; ``ES_COMPILATION_CACHE=off`` leaves it off).
    """
    kind, template, x0 = _checked(fun, x0, sigma0, strategy, max_evals, target, restarts, seed)
    options = checked(x0, bounds, constraints, integer_variables, noisy)
    check_strategy(options, template)
    if options is not None and options.box is not None and not isinstance(template, (CMAES, SepCMAES)):
        bounds_layer.warn_if_wider(options.box, float(sigma0))
    if strategy is None and options is not None and options.integers is not None:
        dim = sum(np.size(leaf) for leaf in jax.tree.leaves(x0))
        template = dataclasses.replace(template, popsize=integers.popsize(dim, options.integers))
    _check_budget(max_evals, template.popsize)
    schedule = Schedule(restarts, template.popsize, sigma0, seed)
    compilation_cache.enable_by_default()
    with float64():
        x0 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), x0)
        run = _Minimization(fun, kind, template, x0, max_evals, target, seed, restarts)
        run.layers = layers.Layers(options or Options(), fun, kind, x0, seed)
        return run.run_all(schedule)


def run_key(seed: int, index: int) -> jax.Array:
    """The key of run ``index`` of a call with ``seed``: ``fold_in(key(seed), index)``, computed on the host
    for JAX's default threefry keys (``threefry.fold_in_on_host``: no program, where the eager calls compiled
    one each), else by one small program."""
    if jax.config.jax_default_prng_impl == "threefry2x32" and seed < 2**63 and index < 2**31:
        return jax.random.wrap_key_data(threefry.fold_in_on_host(seed, index))
    return _run_key(seed, index)


@jax.jit
def _run_key(seed, index: int) -> jax.Array:
    return jax.random.fold_in(jax.random.key(seed), index)


class _Minimization:
    """The state of one ``minimize`` call across its runs: the budget, the best point, the history."""

    def __init__(self, fun, kind, template: Strategy, x0, max_evals: int, target, seed: int, restarts=None):
        self.fun, self.kind, self.template, self.x0 = fun, kind, template, x0
        self.programs = _Programs(x0, template.popsize if restarts else None)
        self.max_evals, self.target, self.seed = max_evals, target, seed
        self.nfev, self.nit = 0, 0
        self.best_x, self.best = None, math.inf
        self.history = {name: [] for name in ("nfev", "fun", "generation_fun", "sigma", "popsize", "run")}
        self.runs: list[Run] = []
        self.layers: layers.Layers | None = None  # a generation (bounds, constraints, integers, noise), run_all's

    # ----------------------------------------------------------------- the call

    def run_all(self, schedule: Schedule) -> MinimizeResult:
        settings, used, stop = schedule.next(), 0, ""
        while settings is not None:
            strategy = self.with_layers(dataclasses.replace(self.template, popsize=settings.popsize,
                                                            sigma=settings.sigma, maximize=False))
            if self.max_evals - self.nfev < self.generation_cost(strategy):
                stop = f"max_evals: the budget of {self.max_evals} evaluations is spent"
                break
            before = (self.nfev, self.nit)
            if schedule.restarts is not None and self.kind != "python":  # compile the next large run's meanwhile
                self.programs.prefetch(self.with_layers(
                    dataclasses.replace(strategy, popsize=schedule.next_large_popsize())))
            run_stop = self.one_run(strategy, settings, len(self.runs))
            used = self.nfev - before[0]
            values = np.asarray(self.history["generation_fun"][before[1]:], np.float64)
            run_best = float(np.nanmin(values)) if np.any(np.isfinite(values)) else math.inf
            self.runs.append(Run(settings.regime, settings.popsize, settings.sigma, used, self.nit - before[1],
                                 run_best, run_stop))
            stop = run_stop
            if self.reached_target() or self.nfev >= self.max_evals:
                break
            settings = schedule.next(used)
        self.programs.close()
        return self.result(stop)

    def one_run(self, strategy: Strategy, settings: RunSettings, index: int) -> str:
        """Run ``strategy`` from ``x0`` until a stopping condition, the budget, the target or its generations."""
        state = self.layers.limited(strategy.init(run_key(self.seed, index), self.layers.genotype(self.x0)))
        limit = settings.max_generations or math.inf
        generations = 0
        self.layers.start_run()
        # Every kind of objective: es.engine's ask/tell loop, checked once, one compiled call a generation.
        state = loop.Loop(strategy, state, *self.programs.get(strategy))
        state.members = state.first()
        while True:
            state, done, stop = self.layers.generation(self, strategy, state, index, limit - generations)
            generations += done
            if self.reached_target():
                stop = f"target: fun(x) = {float(self.best)!r} <= target = {float(self.target)!r}"
            elif self.max_evals - self.nfev < max(1, self.generation_cost(strategy)) and not stop:
                stop = f"max_evals: the budget of {self.max_evals} evaluations is spent"
            elif generations >= limit and not stop:
                stop = f"max_generations: this small-population run's {int(limit)} generations are spent"
            if stop:
                self.layers.end_run(self, state)
                return stop

    # ----------------------------------------------------------------- options (es.blackbox.layers)

    def with_layers(self, strategy: Strategy) -> Strategy:
        return self.layers.strategy(strategy)

    def generation_cost(self, strategy: Strategy) -> int:
        """Evaluations left that a run's next generation needs (a Python objective's may be cut short)."""
        return self.layers.cost(strategy.popsize)

    # ----------------------------------------------------------------- bookkeeping

    def record(self, best_fitness: float, sigma: float, generation_best: float, popsize: int, index: int) -> None:
        self.nit += 1
        best = min(self.best, best_fitness)
        for name, value in (("nfev", self.nfev), ("fun", best), ("generation_fun", generation_best),
                            ("sigma", sigma), ("popsize", popsize), ("run", index)):
            self.history[name].append(value)

    def stop_text(self, strategy: Strategy, mask: int) -> str:
        return "; ".join(stopping.reasons(mask, self.dim, strategy.popsize)) if mask else ""

    @property
    def dim(self) -> int:
        return sum(int(np.size(x)) for x in jax.tree.leaves(self.x0))

    def reached_target(self) -> bool:
        return self.target is not None and self.best <= self.target

    def result(self, stop: str) -> MinimizeResult:
        if self.reached_target():
            success = True
        else:
            success = self.target is None and any(stop.startswith(name + ":") or f"; {name}:" in stop
                                                  for name in CONVERGED)
        history = {name: np.asarray(values, np.float64 if name in ("fun", "generation_fun", "sigma") else np.int64)
                   for name, values in self.history.items()}
        x, fun, feasible, violation = self.layers.outcome(self)
        success = success and feasible
        x = x if x is not None else jax.tree.map(np.asarray, self.x0)
        return MinimizeResult(jax.tree.map(lambda a: np.asarray(a, np.float64), x), fun, self.nfev,
                              self.nit, tuple(self.runs), stop, bool(success), history, feasible, violation,
                              self.layers.ngev)


class _Programs:
    """The ask/tell loop's programs of the runs: a new program for each popsize, or with restarts
    (``first``, the schedule's first popsize) for each group of popsizes that one padded program serves
    (``restarts.program_popsizes``); the next large run's is compiled on a background thread while the
    current run goes on (``prefetch``). Compiled programs are kept for the life of the process (``_COMPILED``),
    as JAX keeps its own.

    Only where this thread mostly waits (a JAX function, which XLA runs; an ``es.HostFitness``, whose workers
    do): with a Python objective this thread evaluates it, holding the GIL that tracing and lowering on the
    other thread need, so on two cores the prefetch slowed the README example (a first call 4.47 against
    5.54 s without it) where it speeds a JAX function's (docs/benchmarks.md, "Compilation in a BIPOP run")."""

    def __init__(self, x0, first: int | None = None):
        self.x0 = x0
        self.signature = (jax.tree.structure(x0), tuple((np.shape(a), str(a.dtype)) for a in jax.tree.leaves(x0)))
        dim = sum(int(np.size(a)) for a in jax.tree.leaves(x0))
        self.served = {} if first is None else program_popsizes(first, dim, loop.SMALL_WORK)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="es.minimize compile")

    def program(self, strategy: Strategy) -> Strategy:
        """The strategy the program of ``strategy``'s runs is compiled for: its popsize padded where it pads."""
        popsize = self.served.get(strategy.popsize, strategy.popsize) if loop.pads(strategy) else strategy.popsize
        return loop.resized(strategy, popsize)

    def key(self, strategy: Strategy):
        return strategy.program(), self.signature

    def prefetch(self, strategy: Strategy) -> None:
        program = self.program(strategy)
        key = self.key(program)
        if key not in _COMPILED:
            _COMPILED[key] = self.pool.submit(loop.Loop.compile, program, self.x0)

    def get(self, strategy: Strategy):
        """``(compiled program, its popsize)``: a prefetch's (waiting for it), else compiled now on this thread
        (kept; not queued on the pool behind the prefetch of the next large run)."""
        program = self.program(strategy)
        key = self.key(program)
        if key not in _COMPILED:
            compiled = loop.Loop.compile(program, self.x0)  # stored only once made: a failure is raised here
            _COMPILED[key] = concurrent.futures.Future()
            _COMPILED[key].set_result(compiled)
        return _COMPILED[key].result(), program.popsize

    def close(self) -> None:
        self.pool.shutdown(wait=True)


_COMPILED: dict = {}  # (strategy program, x0 signature) -> future of Loop.compile's program


# --------------------------------------------------------------------------- checks, before anything runs


def _checked(fun, x0, sigma0, strategy, max_evals, target, restarts, seed):
    """``(kind, template strategy, x0 as float64 numpy)`` or a clear error naming the argument."""
    if isinstance(x0, (list, tuple)) and x0 and all(isinstance(v, numbers.Real) for v in x0):
        x0 = np.asarray(x0, np.float64)  # a list of numbers is a vector, as scipy and pycma take it
    leaves = jax.tree.leaves(x0)
    try:
        arrays = [np.asarray(leaf, np.float64) for leaf in leaves]
    except (TypeError, ValueError) as error:
        raise TypeError(f"es.minimize(x0=...): x0 must be an array of numbers (or a pytree of them): {error}") from None
    if not arrays or sum(a.size for a in arrays) == 0:
        raise ValueError("es.minimize(x0=...): x0 is empty; give the initial point, e.g. np.zeros(10).")
    x0 = jax.tree.unflatten(jax.tree.structure(x0), arrays)
    validation.check_finite(x0, "es.minimize(x0=...): x0", "Start from a finite point (x0 must be finite).")
    sigma0 = validation.check_float("es.minimize", "sigma0", sigma0, positive=True, example="0.5")
    if restarts is not None:
        validation.check_choice("es.minimize", "restarts", restarts, RESTARTS[1:])
    validation.check_int("es.minimize", "seed", seed, 0)
    if target is not None:
        validation.check_float("es.minimize", "target", target, example="1e-8")
    dim = sum(a.size for a in arrays)
    if strategy is None:
        popsize = 4 + math.floor(3 * math.log(dim))
        template = (CMAES if dim <= MAX_DIM else SepCMAES)(popsize=popsize, sigma=sigma0, maximize=False)
    elif isinstance(strategy, Strategy):
        template = dataclasses.replace(strategy, sigma=sigma0, maximize=False)
        template.hyperparameters(dim)  # refuses what the strategy cannot serve (CMAES above MAX_DIM)
    else:
        raise TypeError(
            f"es.minimize(strategy={strategy!r}): strategy must be None (CMA-ES) or an es strategy such as "
            "es.SepCMAES(popsize=16) or es.SNES(popsize=32)."
        )
    validation.check_int("es.minimize", "max_evals", max_evals, 1)
    return objective.kind_of(fun, x0), template, x0


def _check_budget(max_evals: int, popsize: int) -> None:
    if max_evals < popsize:
        raise ValueError(
            f"es.minimize(max_evals={max_evals}): the budget must hold at least one generation of "
            f"{popsize} members; use max_evals >= {popsize} (pycma's default is 1e3 * D**2)."
        )

