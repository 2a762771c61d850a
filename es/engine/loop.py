"""es.minimize's ask/tell loop: each generation's tell and the next generation's members in one compiled call.

    loop = Loop(strategy, state)          # compiled ahead of time (Loop.compile, maybe on another thread)
    members = loop.first()                # float[popsize, ...]: the state's members
    (best, sigma, stop), members = loop.step(fitness)   # float64[popsize] in, the next members out
    (best, sigma, stop), members = loop.step(fitness, sigma_factor=1.2)   # sigma x 1.2 before the next members

The program is ``es.tell``'s generation (``ask_tell``'s checks, hyperparameters and code) followed by
``es.ask``'s members, one per strategy program and params shape; the fitness history behind ``tolfun``,
``tolfunhist`` and ``stagnation`` stays on the host (``HostHistory``).

On a CPU, below ``es.noise.MIN_SLICE`` params, the program is compiled with XLA's loop emitters
(``COMPILER_OPTIONS``) instead of its default fusion emitters: such a program compiles in about 25% less time
(a fresh process's es.minimize compiles a few, most of its time to a first result) and runs a
generation as fast. The two round some fused operations differently, so a run may differ in its last bits
from one compiled with the defaults (of the runs checked, a CMA-ES run on 8 params from its first covariance
update and a noisy run on 4; the README example and plain runs on 3 to 6 params did not: docs/benchmarks.md).
Above ``MIN_SLICE`` the loop emitters' member-ordered sums run slower, so the defaults stay; an XLA without
the option compiles with its defaults. Where params x popsize is at most ``SMALL_WORK`` (the first popsizes of
a run on a few params) XLA's backend optimisation is off too: about 30% less compile time again, a generation as
fast, and other last bits than optimised code.

A program is a function of the strategy's program and the params' shapes and dtypes alone, so a later process
loads it by those from ``es.executable_cache`` (where JAX's persistent cache is on) without tracing it.

A CMA-ES loop (without integer variables) runs a padded program (``es.strategies.cma_es.padding``): compiled for
``P`` members, it serves any run of ``lambda <= P`` (``Loop(..., popsize=P)``), whose constants it takes as
traced values; the loop gives the program the run's ``lambda`` fitnesses and ``+inf`` past them, and hands out
the first ``lambda`` members. So one program serves the popsizes of several restarts (``es.minimize``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from es import executable_cache
from es.engine import ask_tell, stopping
from es.engine.compiler import compile_with
from es.engine.fitness_history import HostHistory
from es.fitness import Fitnesses, from_host
from es.noise import MIN_SLICE, Layout
from es.strategies import cma_es
from es.strategies.base import State, Strategy

COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
"""XLA's options for a loop's program on a CPU below ``MIN_SLICE`` params: the loop emitters, which compile faster."""
SMALL_WORK = 256
"""At most this many ``params x popsize``, the loop's program is also compiled without XLA's backend optimisation
(``xla_backend_optimization_level`` 0): about 30% less compile time, and a generation as fast at such sizes
(docs/benchmarks.md: slower above, e.g. +33% at 40 params and popsize 15)."""


def compiler_options(dim: int, backend: str, popsize: int | None = None) -> dict | None:
    """``COMPILER_OPTIONS`` for a program over ``dim`` params on ``backend`` (``jax.default_backend()``), or
    ``None`` (XLA's defaults): on a CPU below ``MIN_SLICE`` params only; with the optimisation level 0 too where
    ``dim * popsize <= SMALL_WORK``."""
    if backend != "cpu" or dim >= MIN_SLICE:
        return None
    small = popsize is not None and dim * popsize <= SMALL_WORK
    return {**COMPILER_OPTIONS, "xla_backend_optimization_level": 0} if small else dict(COMPILER_OPTIONS)


LOOP_CRITERIA = stopping.StopCriteria()
"""The stopping conditions a ``Loop``'s step reports (pycma's defaults): its driver ends runs on them."""


def pads(strategy: Strategy) -> bool:
    """Whether ``strategy``'s loop runs a padded program (``cma_es.padding``): CMA-ES without a margin."""
    return isinstance(strategy, cma_es.CMAES) and strategy.margin is None


def resized(strategy: Strategy, popsize: int) -> Strategy:
    """``strategy`` with ``popsize`` members: itself where it has them (``dataclasses.replace`` would leave out
    an attached integer margin, which a padded program never has)."""
    return strategy if popsize == strategy.popsize else dataclasses.replace(strategy, popsize=popsize)


def with_padding(strategy: Strategy, hp, dim: int, popsize: int):
    """``hp`` of ``strategy`` (a run of ``strategy.popsize``) for its loop's program of ``popsize`` members:
    with its ``Padding`` where the program is a padded one (``pads``), else ``hp`` itself."""
    if not pads(strategy):
        return hp
    return hp._replace(padding=cma_es.padding(dim, strategy.popsize, popsize, jnp.result_type(float)))


class Loop:
    """An ask/tell loop over one strategy and state layout, for a driver that owns its states (``es.minimize``):
    the checks of ``tell`` made once, and each generation's tell and the next ask in one compiled call.

    ``first()`` gives the members of the state as it is (the first generation's, or after the driver changed
    the state); ``step(fitness, sigma_factor)`` tells their fitnesses and gives ``(best_fitness, sigma, stop)``
    of that generation (one host transfer) and the next members, drawn after the state's ``sigma`` was
    multiplied by ``sigma_factor`` (uncertainty handling's increase; 1 leaves it as it is, bit for bit).
    Every generation is one call of the program, whatever the factor. Both run the loop's one program (``compiled``, as
    ``Loop.compile`` makes it ahead of time, maybe on another thread; ``None``: made here), ``first`` with its
    generation switched off: one program, where a separate ask program was a second. Compiled ahead
    of time, it serves the first state (from ``strategy.init``) and the states it returns alike, where a jitted
    call would compile twice (their arrays are placed differently). The states' ``best_params`` stay as they
    were: the driver keeps its best point itself (``Execution.track_best``). The fitness history that
    ``tolfun``, ``tolfunhist`` and ``stagnation`` read is kept here, on the host (``HostHistory``), where the
    fitnesses are: the program finds only the conditions on the state (``stopping.OnTheState``).
    """

    def __init__(self, strategy: Strategy, state: State, compiled=None, popsize: int | None = None):
        layout = ask_tell._checked(strategy, state, "tell").layout
        self.popsize = popsize or strategy.popsize  # the program's members; the run's are strategy.popsize
        if self.popsize != strategy.popsize and not pads(strategy):
            raise ValueError(f"Loop(popsize={self.popsize}): only a CMA-ES loop without integer variables runs a "
                             f"padded program; compile one of {strategy.popsize} members for {strategy!r}.")
        # On the device once (a padded program's constants are numpy): not put again by every generation's call.
        self.hp = jax.device_put(with_padding(strategy, ask_tell._prepared(strategy, layout, None, LOOP_CRITERIA)[1],
                                              layout.dim, self.popsize))
        self.run_popsize = strategy.popsize
        if self.popsize != strategy.popsize:  # the program's shapes; its history is the host's (self.history)
            state = state._replace(stop_history=stopping.initial_history(layout.dim, self.popsize,
                                                                         state.best_fitness.dtype))
        self.state = state
        self.compiled = compiled or Loop.compile(resized(strategy, self.popsize), state.params)
        self.unused = from_host(np.zeros(self.popsize), "es.tell")  # first()'s fitnesses, never read
        self.switch = jax.device_put((_NO, _YES, np.ones((), self.unused.value.dtype)))  # told or not; factor 1
        self.history = HostHistory(layout.dim, strategy.popsize, self.unused.value.dtype, strategy.maximize,
                                   LOOP_CRITERIA)

    def first(self):
        no, _, one = self.switch
        return self.run(self.compiled(self.hp, self.state, self.unused, no, one)[2])

    def step(self, fitness: np.ndarray, sigma_factor: float = 1.0):
        given = from_host(fitness, "es.tell")
        _, yes, one = self.switch
        factor = one if sigma_factor == 1.0 else np.asarray(sigma_factor, given.value.dtype)
        outputs = self.compiled(self.hp, self.state, self.padded(given), yes, factor)
        self.state, summary, members = ask_tell._keyed(outputs, self.state.key)
        best, sigma, stop = np.asarray(summary).tolist()
        self.history.record(given.value, given.residual)
        return (best, sigma, int(stop) | self.history.bitmask()), self.run(members)

    def padded(self, given: Fitnesses) -> Fitnesses:
        """The run's fitnesses, then ``inf`` (an invalid member; its weight is 0) for the program's others."""
        extra = self.popsize - given.value.shape[0]
        if not extra:
            return given
        return Fitnesses(np.concatenate([given.value, np.full(extra, np.inf, given.value.dtype)]),
                         np.concatenate([given.residual, np.zeros(extra, given.residual.dtype)]))

    def run(self, members):
        """The run's members of the program's: the first ``strategy.popsize``."""
        if self.run_popsize == self.popsize:
            return members
        return jax.tree.map(lambda a: np.asarray(a)[:self.run_popsize], members)

    @staticmethod
    def compile(strategy: Strategy, params):
        """The loop's program for ``strategy`` and params shaped like ``params``, compiled now (shapes only:
        nothing runs), or loaded without tracing where an earlier process compiled it (``es.executable_cache``:
        on where JAX's persistent cache is). Safe on another thread, so a driver can compile the next run's
        while this one runs."""
        leaves = jax.tree.leaves(params)
        options = compiler_options(sum(np.size(a) for a in leaves), jax.default_backend(), strategy.popsize)
        configuration = ("es.engine.loop.Loop", strategy.program(), repr(jax.tree.structure(params)),
                         tuple((np.shape(a), str(jax.dtypes.canonicalize_dtype(a.dtype))) for a in leaves), options)
        return executable_cache.load_or_compile(configuration, lambda: Loop._compiled(strategy, params, options),
                                                "jit(_tell_ask_compiled)")

    @staticmethod
    def _compiled(strategy: Strategy, params, options: dict | None):
        state = jax.eval_shape(lambda: strategy.init(jax.random.key(0), params))
        layout = Layout.of(state.params)
        program, hp, mesh, execution = ask_tell._prepared(strategy, layout, None, LOOP_CRITERIA)
        hp = with_padding(strategy, hp, layout.dim, strategy.popsize)  # its structure: the values come with each call
        # The driver keeps its best point itself, and the fitness history (Loop.history).
        execution = dataclasses.replace(execution, track_best=False, criteria=stopping.OnTheState(LOOP_CRITERIA))
        dtype = jnp.result_type(float)
        given = Fitnesses(*(jax.ShapeDtypeStruct((strategy.popsize,), dtype),) * 2)
        switch, factor = jax.ShapeDtypeStruct((), jnp.bool_), jax.ShapeDtypeStruct((), dtype)
        lowered = _tell_ask_compiled.lower(program, mesh, execution, hp, state, given, switch, factor)
        return compile_with(lowered, options)  # an XLA without an option (jax 0.11: the emitters' flag) leaves it out


_YES, _NO = np.bool_(True), np.bool_(False)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _tell_ask_compiled(program, mesh, execution, hp, state, given, generation, sigma_factor):
    """``(state, summary, members)``: where ``generation`` (a traced bool), one generation from ``given`` (as
    ``_tell_compiled``; ``summary`` its best fitness, sigma and stop mask), else ``state`` as it is (``summary``
    zeros); then the state's ``sigma`` times ``sigma_factor`` (where the strategy's state has one), and that
    state's members (as ``_ask_compiled`` builds them). The state's ``key`` is ``None``."""

    def told(state):
        new, metrics, _ = ask_tell._tell_compiled(program, mesh, execution, None, hp, state, given)
        summary = jnp.stack([metrics["best_fitness"], metrics["sigma"].astype(metrics["best_fitness"].dtype),
                             metrics["stop"].astype(metrics["best_fitness"].dtype)])
        return new._replace(key=state.key), summary

    state, summary = jax.lax.cond(generation, told, lambda state: (state, jnp.zeros((3,), state.best_fitness.dtype)),
                                  state)
    inner = state.strategy_state
    if hasattr(inner, "sigma"):  # x 1.0 is exact: only a factor other than 1 changes anything
        sigma = inner.sigma * sigma_factor.astype(inner.sigma.dtype)
        state = state._replace(strategy_state=inner._replace(sigma=sigma))
    return state._replace(key=None), summary, ask_tell._members(program, 0, program.popsize, False, hp, state)
