"""Generations of a fitness evaluated on the host (``es.HostFitness``): the population dispatched whole, then the
update, so that no device ever waits in a collective while the host evaluates.

Each generation is two small compiled programs around one host dispatch::

    every device (no collective)          host (this process)                    every device
    -----------------------------         ----------------------------------     ---------------------------------
    its members' params and seeds  --->   the whole local population in one  --->  fitnesses all-gathered (all are
    (es.engine.members, the same          pool dispatch (es.host.pool), however    ready), ranked, the update:
    code as es.evolve's)                  long each member takes                    es.engine.generation_step

The members program has no collective; the update program starts only once the fitnesses of every device (of
every process: they agree first, host-side, through ``es.distributed.all_processes``) are on the devices, so
an evaluation may take seconds or hours, devices may finish their shares at any time apart, and XLA's
collectives never time out. The update is ``generation_step`` with the fitnesses given (``GivenFitness``), the
step ``es.tell`` and ``es.evolve_many`` run: the same bits as on any mesh, and a member's params and seed are
rebuilt from the shared keys as ``es.evolve`` builds them.

Both programs are compiled once per strategy program, mesh, execution and state shapes, whatever the number of
generations. Between generations the loop checks ``stop()`` (``es.run``'s first SIGINT/SIGTERM) and returns
the generations done; a failed evaluation raises ``es.FitnessError`` once every process knows of it.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from es.engine.evolution import run_generations
from es.engine.generation import METRIC_NAMES, this_generation
from es.engine.members import member_seed
from es.fitness import Fitness, FitnessError, Fitnesses, GivenFitness, from_host
from es.noise import Layout
from es.parallel import distributed
from es.parallel.global_arrays import replicate
from es.strategies.base import State, Strategy

PyTree = Any
Metrics = dict[str, jax.Array]

# Numbers the host-fitness generations of this process, so that every process of a multi-process run agrees on
# the outcome of the same generation under the same name (they all make the same es.evolve calls in order).
_generation_numbers = itertools.count()


def evolve_on_host(strategy: Strategy, fitness: Fitness, state: State, num_generations: int, mesh: Mesh, execution,
                   stop: Callable[[], bool] | None = None) -> tuple[State, Metrics]:
    """``num_generations`` generations (fewer where ``stop()`` turns true between two) of an on-host fitness.

    ``fitness`` is an adapter with ``on_host`` (``es.HostFitness``, or it under ``es.CommonRandomNumbers``);
    the arguments passed ``check_evolve_args``. Returns ``(state, metrics)`` as ``es.evolve`` does, the
    metrics' leading axis the generations run.
    """
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(state)):
        raise TypeError(
            "es.evolve with an es.HostFitness cannot be traced (called under jax.jit, vmap or grad): its members "
            "are evaluated on the host between compiled generations. Call es.evolve directly."
        )
    state = replicate(state, mesh)
    hp = strategy.hyperparameters(Layout.of(state.params).dim)
    members, update = _programs(strategy.program(), fitness, mesh, execution)
    rows: list[Metrics] = []
    generation = int(distributed.fetch(state.generation))
    for _ in range(num_generations):
        params, seeds = members(hp, state)
        given, stopping = _evaluated(fitness, generation, (params, seeds, state.fitness_state), mesh, stop)
        state, metrics = update(hp, state, *given)
        rows.append(metrics)
        generation += 1
        if stopping:
            break
    if rows:
        host = [distributed.fetch(row) for row in rows]
        stacked = {name: np.stack([row[name] for row in host]) for name in METRIC_NAMES}
    else:
        stacked = _no_metrics(strategy.program(), mesh, execution, hp, state)
    return state, replicate(stacked, mesh)


# --------------------------------------------------------------------------- the two programs


def _programs(program: Strategy, fitness: Fitness, mesh: Mesh, execution) -> tuple[Callable, Callable]:
    """The members program and the update program (jitted: compiled on first use, per state shapes). The
    update reads the fitness only to fold a stateful fitness's stats into its state: every other host fitness
    shares one update program."""
    return (functools.partial(_members_compiled, program, fitness.shared_by, mesh),
            functools.partial(_update_compiled, program, fitness if fitness.stateful else None, mesh, execution))


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _members_compiled(program, shared_by, mesh, hp, state):
    """Every device's members: ``(params, seeds)``, leading axis ``popsize`` sharded over the mesh."""
    def local(hp, state):
        size = program.popsize // mesh.size
        indices = jax.lax.axis_index(mesh.axis_names) * size + jnp.arange(size, dtype=jnp.int32)
        generation = this_generation(program, hp, program.noise.prepare(Layout.of(state.params)), state)
        seeds = jax.vmap(member_seed)(generation.eval_keys(indices, shared_by))
        return generation.members(indices, False), seeds

    population = P(mesh.axis_names)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P()), out_specs=population, check_vma=False)(hp, state)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _update_compiled(program, fitness, mesh, execution, hp, state, values, stats):
    """One generation from every device's given fitnesses (sharded over the mesh): ``(state, metrics)``;
    ``fitness``: the adapter of a stateful fitness (whose ``update_state`` folds in ``stats``), else ``None``."""
    def one_generation(hp, state, values, stats):
        first = jax.lax.axis_index(mesh.axis_names) * (program.popsize // mesh.size)
        given = GivenFitness(values, stats, first=first, fitness=fitness)
        state, metrics = run_generations(program, given, mesh, execution, 1, hp, state)
        return state, jax.tree.map(lambda m: m[0], metrics)

    population = P(mesh.axis_names)
    return jax.shard_map(one_generation, mesh=mesh, in_specs=(P(), P(), population, population), out_specs=P(),
                         check_vma=False)(hp, state, values, stats)


# --------------------------------------------------------------------------- the host's part


def _evaluated(fitness: Fitness, generation: int, population, mesh: Mesh, stop: Callable[[], bool] | None):
    """This process's members evaluated in one host dispatch: ``((Fitnesses, stats), stopping)``, the values
    sharded as the population, and whether any process asks to stop after this generation (``stop()``).

    ``population`` is ``(params, seeds, fitness_state)``. Raises ``FitnessError`` on every process once any
    process's evaluation failed.
    """
    params, seeds, fitness_state = population
    shards = _local_shards(seeds)
    local = np.concatenate([np.arange(start, end) for start, end, _ in shards])
    host_params = jax.tree.map(lambda x: np.concatenate([np.asarray(s.data) for s in _by_start(x)]), params)
    host_seeds = np.concatenate([np.asarray(s.data) for s in _by_start(seeds)])
    state = jax.tree.map(np.asarray, distributed.fetch(fitness_state)) if fitness.stateful else None
    values, stats, failure = fitness.evaluate_host(generation, local, host_seeds, host_params, state)
    stopping = stop is not None and bool(stop())
    outcomes = [(failure or "", stopping)]
    if distributed.process_count() > 1:
        texts = distributed.all_processes(f"es.host/{next(_generation_numbers)}", f"{int(stopping)}{failure or ''}")
        outcomes = [(text[1:], text[0] == "1") for text in texts]
    failed = [(process, text) for process, (text, _) in enumerate(outcomes) if text]
    if failed:
        fitness.close()
        process, text = failed[0]
        raise FitnessError(text if len(outcomes) == 1 else f"process {process}: {text}")
    given = from_host(values, f"es.HostFitness in generation {generation}")
    sharding = NamedSharding(mesh, P(mesh.axis_names))
    popsize = seeds.shape[0]
    sharded = (_sharded(given, shards, sharding, popsize),
               _sharded(stats if fitness.stateful else (), shards, sharding, popsize))
    return sharded, any(asked for _, asked in outcomes)


def _by_start(x: jax.Array) -> list:
    """``x``'s shards on this process's devices, in member order."""
    return sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)


def _local_shards(x: jax.Array) -> list[tuple[int, int, Any]]:
    """``(first member, end, device)`` of every shard of ``x`` on this process, in member order."""
    return [(s.index[0].start or 0, s.index[0].stop or x.shape[0], s.device) for s in _by_start(x)]


def _sharded(tree: PyTree, shards, sharding: NamedSharding, popsize: int) -> PyTree:
    """Host arrays of this process's members (leading axis: its members in order) as global arrays sharded like
    the population."""
    def leaf(x):
        x = np.asarray(x)
        offset, pieces = 0, []
        for start, stop, device in shards:
            pieces.append(jax.device_put(x[offset:offset + stop - start], device))
            offset += stop - start
        return jax.make_array_from_single_device_arrays((popsize, *x.shape[1:]), sharding, pieces)

    return jax.tree.map(leaf, tree)


def _no_metrics(program: Strategy, mesh: Mesh, execution, hp, state: State) -> dict[str, np.ndarray]:
    """The metrics of zero generations: empty arrays of the dtypes a generation reports."""
    popsize, dtype = program.popsize, state.best_fitness.dtype
    sharding = NamedSharding(mesh, P(mesh.axis_names))
    values = Fitnesses(*(jax.ShapeDtypeStruct((popsize,), dtype, sharding=sharding),) * 2)
    one = functools.partial(_update_compiled, program, None, mesh, execution)  # no fitness state: no stats
    shapes = jax.eval_shape(one, hp, state, values, ())[1]
    return {name: np.zeros((0, *shapes[name].shape), shapes[name].dtype) for name in METRIC_NAMES}
