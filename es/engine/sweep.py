"""Sweeps: many runs of one strategy, over seeds and numeric hyperparameters, as one compiled program.

    strategies = [es.OpenES(popsize=64, sigma=s) for s in (0.05, 0.1) for _ in range(8)]
    states = [st.init(jax.random.key(seed), params) for st, seed in zip(strategies, list(range(8)) * 2)]
    states, metrics = es.evolve_many(strategies, fitness_fn, states, 100, mesh=es.make_mesh())

The runs are stacked along a leading run axis and ``engine.generation_step``
is ``vmap``ped over it, inside the same ``shard_map`` as ``es.evolve``::

    device d of n, every generation             every device
    ---------------------------------           ------------------------------------------
    for each micro-batch of its share:           fitness f32[runs, popsize] (all-gathered)
      members of every run (vmap)      ---->     every run's update (vmap), noise rebuilt
      evaluate them together                     in chunks of update_batch_size per run

so each device evaluates its share of every run's population, only fitnesses
(``runs x popsize`` scalars) cross devices, and peak memory grows with
``runs x (eval_batch_size + update_batch_size) x num_params``, never with
popsize. One compilation serves all the runs, and a later call whose runs
vary the same fields (with other values) reuses it.

What may differ between the runs: the state (any seed, any initial params
of one structure) and the strategy's hyperparameters (its float fields,
``Strategy.hyperparameters(dim)``: ``sigma``, ``weight_decay``, learning
rates...), which the program takes as a traced pytree, stacked over the runs
and ``vmap``ped: the runs' strategies must have one ``Strategy.program()``.
Optimizers may differ only where their numbers live in their state, i.e.
optimizers built with ``optax.inject_hyperparams``; two optimizers are
accepted when their ``update`` traces to the same program. Everything else
(kind, ``popsize``, ``antithetic``, noise source, shaping, schedules,
whatever a float decides about the program's structure, params structure)
must be equal, or ``evolve_many`` raises an error that names what differs.

Equality with separate ``es.evolve`` runs: every run follows its own
``es.evolve`` (same keys, same members, same update). Bit for bit where
``vmap`` leaves XLA's arithmetic alone, which we test for every strategy on
``jnp`` fitness functions; a hyperparameter that varies is a runtime value
instead of a compile-time constant, and XLA may round an expression with it
differently (see docs/guides/sweeps.md for what we measured).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from es import validation
from es.engine.evolution import (Generations, evolve_checked, first_rows, program_generations, scan_generations,
                                 shard_generations)
from es.engine.execution import Execution, check_evolve_args, check_state
from es.engine.generation import evaluate_local, generation_step, this_generation
from es.fitness import Fitness, GivenFitness, adapter
from es.noise import Layout
from es.parallel.global_arrays import replicate
from es.strategies.base import TRACED, State, Strategy

PyTree = Any
Metrics = dict[str, jax.Array]


class Sweep(NamedTuple):
    """What ``check_evolve_many_args`` resolves: the program's static parts and the runs' hyperparameters.

    Attributes:
      program: the strategy the program is compiled for: ``strategies[0].program()``
        with the optimizers every run computes with.
      hyperparameters: the runs' ``hyperparameters(dim)``, each leaf stacked
        along a leading run axis.
      mesh, execution: as ``es.evolve`` resolves them.
      first: ``strategies[0]`` (a one-run sweep runs ``es.evolve``'s program).
    """

    program: Strategy
    hyperparameters: PyTree
    mesh: Mesh
    execution: Execution
    first: Strategy


def evolve_many(
    strategies: Sequence[Strategy],
    fitness_fn: Callable,
    states: Sequence[State],
    num_generations: int,
    mesh: Mesh | None = None,
    *,
    exchange: str = "fitness",
    eval_batch_size: int | None = None,
    update_batch_size: int | None = None,
    stop_criteria=None,
) -> tuple[list[State], list[Metrics]]:
    """Run ``num_generations`` generations of several runs at once: one compiled program, vmapped over the runs.

    Args:
      strategies: a list of strategies of one kind that differ at most in
        their hyperparameters (their float fields) and in optimizers built
        with ``optax.inject_hyperparams``.
      fitness_fn: as for ``es.evolve``, shared by every run.
      states: one state per strategy (``strategies[i].init(...)``, any seed;
        params of one structure, shapes and dtypes), or the states a previous
        ``evolve_many`` returned.
      num_generations: a Python int >= 0.
      mesh, exchange, eval_batch_size, update_batch_size, stop_criteria: as
        for ``es.evolve``; each device evaluates its share of every run's
        population, ``eval_batch_size`` members of every run at a time.

    Returns:
      ``(states, metrics)``: lists with one final state and one metrics dict
      per run, in the order of ``strategies``; each as ``es.evolve`` returns
      it for that run. Run ``i`` equals ``es.evolve(strategies[i],
      fitness_fn, states[i], ...)``: bit for bit where XLA compiles the
      vmapped arithmetic identically, otherwise within float32 rounding
      (module docstring, docs/guides/sweeps.md); always bit for bit for a
      single run, which runs ``es.evolve``'s own program.

    Raises:
      TypeError / ValueError before anything is compiled, naming the run and
      the field that differs, for strategies of different kinds or programs,
      optimizers that compute differently, states of another structure, and
      everything ``es.evolve`` refuses.
    """
    fitness = adapter(fitness_fn)  # the one adapter of the call
    sweep = check_evolve_many_args(strategies, fitness, states, num_generations, mesh, exchange, eval_batch_size,
                                   update_batch_size, stop_criteria)
    return evolve_many_checked(sweep, fitness, states, num_generations)


def evolve_many_checked(sweep: Sweep, fitness: Fitness, states: Sequence[State], num_generations: int | Generations):
    """``evolve_many`` once its arguments passed ``check_evolve_many_args`` (``es.run_many``: every segment).

    The states are stacked along a leading run axis on the way into the
    program and split again on the way out, in the same program (no small
    programs of their own to compile). One run is ``es.evolve``'s
    own program: as a one-trip ``lax.map``, which XLA inlines and fuses with
    what surrounds it, its update could round otherwise than ``es.evolve``'s.
    """
    if len(states) == 1:
        state, metrics = evolve_checked(sweep.first, fitness, states[0], num_generations, sweep.mesh,
                                        sweep.execution)
        return [state], [metrics]
    # init's states and the ones a previous call returned are placed differently: both replicated, one program
    hyperparameters, states = replicate((sweep.hyperparameters, list(states)), sweep.mesh)
    static, count = program_generations(num_generations)
    states, metrics = _evolve_many_compiled(sweep.program, fitness, sweep.mesh, sweep.execution, static,
                                            hyperparameters, states, count)
    return states, first_rows(metrics, num_generations)


def stack(states: list[State]) -> State:
    """The states as one, every leaf with a leading run axis."""
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)


def unstack(stacked: State, metrics: Metrics) -> tuple[list[State], list[Metrics]]:
    """Every run's state and metrics (``[generations]`` each) from the stacked ones (``[generations, runs]``)."""
    count = jax.tree.leaves(stacked)[0].shape[0]
    states = [jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(count)]
    return states, [{name: m[:, i] for name, m in metrics.items()} for i in range(count)]


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _evolve_many_compiled(program, fitness, mesh, execution, num_generations, hyperparameters, states, count):
    """As ``evolution._evolve_compiled``, for a list of runs: ``(states, metrics)``, lists of one per run, the
    states stacked along a leading run axis for the generations and split again after them."""
    run = functools.partial(run_many_generations, program, fitness, mesh, execution)
    stacked, metrics = shard_generations(run, mesh, num_generations, count)(hyperparameters, stack(states))
    return unstack(stacked, metrics)


def run_many_generations(program, fitness, mesh, execution, num_generations, hyperparameters, states):
    """``num_generations`` generations of every run (inside the ``shard_map``): a scan of ``sweep_step``.

    Returns the stacked states and metrics of shape ``[generations, runs]``.
    """
    layout = Layout.of(jax.tree.map(lambda x: x[0], states.params))  # one run's params
    noise_aux = program.noise.prepare(layout)  # shared: the runs have the same noise source
    step = functools.partial(sweep_step, program, fitness, mesh, execution, noise_aux, hyperparameters)
    # With the split update each device carries its slices of every run's private state, as es.evolve does.
    return scan_generations(mesh, execution, layout.dim, step, num_generations, states, batched=True)


def sweep_step(program, fitness, mesh, execution, noise_aux, hyperparameters, states):
    """One generation of every run, on one device: the evaluation vmapped over the runs, then each run's update.

    1. ``vmap`` over the runs of ``evaluate_local``: this device's members of
       every run, ``eval_batch_size`` of each run at a time (so the fitness
       function sees ``runs x eval_batch_size`` members at once: where a
       sweep gains its speed on small populations).
    2. ``lax.map`` over the runs of ``generation_step``, whose evaluation
       reads the fitnesses of step 1 (``GivenFitness``): the exchange, the
       strategy's update and the metrics run one run at a time, in the same
       shapes as in ``es.evolve``, so XLA compiles that arithmetic as it does
       there and each run stays bit-identical to its own ``es.evolve`` (a
       ``vmap`` would batch its reductions, which XLA may round differently).
    """

    def evaluate(hp, state):
        members = this_generation(program, hp, noise_aux, state)
        return evaluate_local(program, fitness, mesh, execution, members, state)

    local_members, (local_fitness, local_stats) = jax.vmap(evaluate)(hyperparameters, states)

    def update(run):
        hp, state, run_fitness, run_stats, members = jax.lax.optimization_barrier(run)
        given = GivenFitness(run_fitness, run_stats, first=members[0], fitness=fitness)
        return jax.lax.optimization_barrier(
            generation_step(program, given, mesh, execution, noise_aux, execution.criteria, hp, state))

    return jax.lax.map(update, (hyperparameters, states, local_fitness, local_stats, local_members))


# --------------------------------------------------------------------------- checks


def check_evolve_many_args(
    strategies, fitness: Fitness, states, num_generations, mesh, exchange="fitness", eval_batch_size=None,
    update_batch_size=None, stop_criteria=None, caller: str = "es.evolve_many",
) -> Sweep:
    """Validate ``evolve_many``'s arguments before any compilation; return the ``Sweep`` (``fitness``: the
    adapter the entry point made; ``caller``: the entry point the messages name, ``es.run_many`` too)."""
    for name, value, one, singular in (("strategies", strategies, Strategy, "strategy"),
                                       ("states", states, State, "state")):
        if isinstance(value, one):
            raise TypeError(
                f"{caller}({name}=...): got one {'es.State' if one is State else 'strategy'}; {name} must be "
                f"a list with one entry per run, e.g. {name}=[{singular}]."
            )
        if not isinstance(value, (list, tuple)) or not value:
            raise TypeError(
                f"{caller}({name}=...): {name} must be a non-empty list (one entry per run), "
                f"got {type(value).__name__}."
            )
    if len(states) != len(strategies):
        raise ValueError(
            f"{caller}: {len(strategies)} strategies but {len(states)} states; give one state per "
            "strategy (repeat a strategy to run it from several seeds)."
        )
    for i, strategy in enumerate(strategies):
        if not isinstance(strategy, Strategy):
            raise TypeError(
                f"{caller}: strategies[{i}] must be an es strategy (es.OpenES, es.SNES, ...), "
                f"got {type(strategy).__name__}."
            )
    if fitness.on_host:
        raise TypeError(
            f"{caller}(fitness_fn=...): an es.HostFitness is not supported in a sweep yet; run each seed "
            "with es.evolve or es.run (or drive the runs with es.ask/es.tell)."
        )
    mesh, execution = check_evolve_args(strategies[0], fitness, states[0], num_generations, mesh, exchange,
                                        eval_batch_size, update_batch_size, stop_criteria)
    optimizers = check_same_program(strategies, states[0].params, caller)
    for i in range(1, len(strategies)):
        _check_run_state(i, strategies[i], fitness, states[i], states[0], caller)
    dim = Layout.of(states[0].params).dim
    dtype = jnp.result_type(float)
    hyperparameters = jax.tree.map(lambda *values: np.asarray(values, dtype),
                                   *[s.hyperparameters(dim) for s in strategies])
    program = dataclasses.replace(strategies[0], **optimizers).program() if optimizers else strategies[0].program()
    return Sweep(program, hyperparameters, mesh, execution, strategies[0])


def check_same_program(strategies: Sequence[Strategy], params: PyTree, caller: str = "es.evolve_many") -> dict:
    """The optimizer each optimizer field compiles with; raise unless every run has ``strategies[0]``'s program.

    Hyperparameters (float fields) may differ. Optimizers must compute the
    same function of ``(gradient, optimizer state, params)`` (see
    ``check_same_optimizer``). Every other field must be equal, including
    what a float decides about the program (PGPE's ``sigma_learning_rate=0``).
    """
    first = strategies[0]
    kind = type(first).__name__
    for i, strategy in enumerate(strategies[1:], start=1):
        if type(strategy) is not type(first):
            raise TypeError(
                f"{caller}: strategies[{i}] is {type(strategy).__name__} but strategies[0] is {kind}; the "
                f"runs of one {caller} share one program, so they must be strategies of one kind (run each "
                f"kind in its own {caller} call)."
            )
    programs = [s.program() for s in strategies]
    traced = first.hyperparameter_fields()
    optimizers = {}
    for field in dataclasses.fields(first):
        name = field.name
        values = [getattr(p, name) for p in programs]
        if all(isinstance(v, optax.GradientTransformation) for v in values):
            optimizers[name] = check_same_optimizer(kind, name, values, params, caller)
            continue
        for i, value in enumerate(values[1:], start=1):
            if _same_setting(value, values[0]):
                continue
            if not field.init:  # derived from a setting: name it
                source = field.metadata.get("derived_from", name)
                raise ValueError(
                    f"{caller}: strategies[{i}].{source}={getattr(strategies[i], source)!r} but "
                    f"strategies[0].{source}={getattr(first, source)!r}; for {kind} {source}="
                    f"{field.metadata.get('why', 'decides the program')}, so it shapes the compiled program. The "
                    f"runs may vary {source} only among values that agree on that; run the two settings in two "
                    f"{caller} calls."
                )
            shown = [getattr(strategies[j], name) for j in (i, 0)]
            raise ValueError(
                f"{caller}: strategies[{i}].{name}={shown[0]!r} but strategies[0].{name}={shown[1]!r}. "
                f"The runs may differ only in the hyperparameters of {kind} ({', '.join(traced) or 'none'}; "
                f"floats) and in optimizers built with optax.inject_hyperparams; {name} shapes the compiled "
                f"program{_same_object_hint(shown[0])}. Give every run the same {name}, or run each setting in its "
                f"own {caller} call."
            )
    return {name: optimizer for name, optimizer in optimizers.items() if optimizer is not getattr(first, name)}


def _same_setting(a, b) -> bool:
    if a is b or (a is TRACED and b is TRACED):
        return True
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # an object whose == cannot answer (arrays): not the same setting
        return False


def _same_object_hint(value) -> str:
    if callable(value):
        return " (a callable, such as a schedule or a shaping function, is compared by identity: pass the same object)"
    return ""


def _uses_inject_hyperparams(state_shape: PyTree) -> bool:
    injected = (optax.InjectHyperparamsState, optax.InjectStatefulHyperparamsState)
    nodes = jax.tree.leaves(state_shape, is_leaf=lambda x: isinstance(x, injected))
    return any(isinstance(node, injected) for node in nodes)


def check_same_optimizer(kind: str, name: str, optimizers: Sequence[optax.GradientTransformation],
                         params, caller: str) -> optax.GradientTransformation:
    """The optimizer to compile with; raise ``ValueError`` unless every optimizer computes what ``optimizers[0]`` does.

    Two optimizers compute the same when their ``update(gradient, state,
    params)`` traces to the same jaxpr with the same constants: the same
    object, two ``optax.adam(1e-2)`` built apart, or two
    ``optax.inject_hyperparams(optax.adam)(learning_rate=...)`` with any
    learning rates (those live in the optimizer state, which is each run's
    own). ``optax.adam(1e-2)`` and ``optax.adam(3e-2)`` differ in a constant.

    Returns the first optimizer seen (in this process) that computes the
    same, so that a later sweep with new but equivalent optimizer objects
    (``inject_hyperparams`` builds one per run) reuses the compiled program.
    """
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), params)
    reference = _update_program(optimizers[0], abstract)
    for i, optimizer in enumerate(optimizers[1:], start=1):
        if optimizer is optimizers[0] or _update_program(optimizer, abstract) == reference:
            continue
        injected = _uses_inject_hyperparams(jax.eval_shape(optimizer.init, abstract))
        fix = (
            "they are both built with optax.inject_hyperparams but differ beyond the hyperparameters in their "
            "state (another inner optimizer, a static argument, or a schedule)" if injected else
            "its numbers are constants of the compiled program. To sweep optimizer hyperparameters, build every "
            "run's optimizer with optax.inject_hyperparams, e.g. "
            "optax.inject_hyperparams(optax.adam)(learning_rate=3e-3), so that they live in each run's state"
        )
        raise ValueError(
            f"{caller}: strategies[{i}].{name} computes differently from strategies[0].{name} ({kind}); "
            f"{fix}."
        )
    if len(_EQUIVALENT_OPTIMIZERS) >= _MAX_REMEMBERED:
        _EQUIVALENT_OPTIMIZERS.clear()
    return _EQUIVALENT_OPTIMIZERS.setdefault(reference, optimizers[0])


# The first optimizer seen for each update program (see check_same_optimizer), at most _MAX_REMEMBERED.
_EQUIVALENT_OPTIMIZERS: dict[tuple, optax.GradientTransformation] = {}
_MAX_REMEMBERED = 256


def _update_program(optimizer: optax.GradientTransformation, abstract_params) -> tuple:
    """What ``optimizer.update`` computes, as data: its state's structure, jaxpr text and constants."""
    state = jax.eval_shape(optimizer.init, abstract_params)
    closed = jax.make_jaxpr(optimizer.update)(abstract_params, state, abstract_params)
    constants = tuple((np.shape(c), str(np.result_type(c)), np.asarray(c).tobytes()) for c in closed.consts)
    return str(jax.tree.structure(state)), str(closed.jaxpr), constants


def _check_run_state(i: int, strategy: Strategy, fitness: Fitness, state, first_state, caller: str) -> None:
    """``state`` must belong to ``strategy`` and have the structure, shapes and dtypes of ``states[0]``."""
    try:
        check_state(strategy, fitness, state)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{caller}: states[{i}] (of strategies[{i}]): {error}") from None
    difference = validation.tree_difference(state, first_state)
    if difference is not None:
        where = f"states[{i}]" + (difference if difference[0] in ".[" else f": {difference}")
        raise ValueError(
            f"{caller}: {where} (as in states[0]). The runs must share one params structure (shapes, "
            "dtypes), key type and fitness state; make every state with strategy.init from params of one "
            "structure."
        )
