"""``es.evolve``: generations in ``lax.scan`` inside one ``jax.jit``, the population ``shard_map``ped over a mesh.

The compiled program's static arguments are the strategy's ``program()`` (its configuration without the
hyperparameter values), the fitness adapter, the mesh, the ``Execution`` and the number of generations;
the hyperparameters and the state are traced. ``generation_step`` (``es.engine.generation``) is the scan's
body. ``es.run``'s segments pass their number as ``Generations``: a traced count in a program compiled for the
segment's length, so that a shorter segment (the last, or the first after a resume) runs the same program.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from es.engine import stopping, update
from es.engine.execution import Execution, check_evolve_args
from es.engine.generation import generation_step
from es.engine.partition import BLOCK, Partition
from es.fitness import Fitness, adapter
from es.noise import Layout
from es.parallel.global_arrays import replicate
from es.strategies.base import State, Strategy

PyTree = Any
Metrics = dict[str, jax.Array]


def evolve(
    strategy: Strategy,
    fitness_fn: Callable,
    state: State,
    num_generations: int,
    mesh: Mesh | None = None,
    *,
    exchange: str = "fitness",
    eval_batch_size: int | None = None,
    update_batch_size: int | None = None,
    stop_criteria: stopping.StopCriteria | None = None,
) -> tuple[State, Metrics]:
    """Run ``num_generations`` generations of ``strategy`` from ``state``.

    Pure: may be called under ``jax.jit``. Calling it again continues the run;
    two calls of ``n`` generations equal one call of ``2n`` bit for bit. A new
    value of a hyperparameter (``sigma``, a learning rate) does not recompile.
    The arguments are checked before anything compiles, once per strategy,
    fitness, state signature and settings: a later call with the same ones
    goes straight to the compiled program (about 1 ms on a CPU).

    Args:
      strategy: ``es.OpenES``, ``es.SNES``, ``es.PGPE``, ``es.ARS``,
        ``es.SepCMAES``, ``es.CMAES`` or your own ``es.Strategy``.
      fitness_fn: ``(params, key) -> scalar`` for one member (or an
        ``es.StatefulFitness``); higher is better when ``strategy.maximize``.
        An ``es.HostFitness`` runs a Python (non-JAX) fitness in worker
        processes, generation by generation between two compiled programs
        (``es.engine.host_loop``); ``evolve`` then returns once the call has
        run, and raises ``es.FitnessError`` if an evaluation failed.
      state: from ``strategy.init`` or a previous ``evolve``.
      num_generations: a Python int >= 0 (static: the scan length).
      mesh: the devices to shard the population over (``es.make_mesh()``,
        which spans every process after ``es.distributed.initialize``);
        ``None`` runs on this process's default device.
      exchange: ``"fitness"`` (default), ``"sharded"``, ``"gradient"`` or
        ``"auto"``; see ``es.engine.Execution``, ``es.exchange_report`` and
        docs/scaling.md. ``"sharded"`` gives the same bits as ``"fitness"``
        with ``1/n`` of its update work per device; ``"auto"`` picks one of
        these two by mesh size and noise source.
      eval_batch_size: members each device evaluates together in one vmapped
        micro-batch (devices loop over their share in such batches). It must
        be the same on every mesh for results to be bit-identical across
        device counts. ``None``: the largest divisor of ``popsize / 8`` (so it
        divides every device's share on 1, 2, 4 or 8 devices) whose
        perturbations fit in ``2**19`` floats (2 MiB), even with antithetic
        sampling so that pairs share one noise draw. For meshes of more than
        8 devices set it to at most ``popsize // num_devices``.
      update_batch_size: noise vectors rebuilt per step when forming the sums
        (one fused loop; nothing is stored). ``None``: ``max(16, 2**19 //
        num_params)``, at most ``2**24 // num_params``.
      stop_criteria: the thresholds of the stopping conditions reported in
        the metric ``"stop"`` (``es.StopCriteria()``: pycma's defaults).
        ``None`` computes none (``"stop"`` is 0) and records no fitness
        history for them (``State.stop_history`` is left as it was), which
        keeps both out of the compiled program: about a third of its
        compile time.

    Peak memory is ``O((eval_batch_size + update_batch_size) * num_params)``,
    independent of popsize.

    Returns:
      ``(state, metrics)``: the new state, replicated on the mesh, and a dict
      of arrays with leading axis ``num_generations`` (see ``es.METRIC_NAMES``).
      On a mesh spanning processes both are global arrays that every process
      can read (``np.asarray``, ``es.distributed.fetch``).
    """
    fitness = adapter(fitness_fn)  # the one adapter of the call
    mesh, execution = check_evolve_args(strategy, fitness, state, num_generations, mesh, exchange,
                                        eval_batch_size, update_batch_size, stop_criteria)
    return evolve_checked(strategy, fitness, state, num_generations, mesh, execution)


class Generations(NamedTuple):
    """A call's number of generations as a run-time value: ``count`` generations (an int; traced inside the
    program) of a program compiled for up to ``capacity`` (static), whose metrics have ``capacity`` rows until
    ``first_rows`` keeps the ``count`` written. ``es.run`` and ``es.run_many`` run every segment so, with the
    segment's length as ``capacity``: one program for all of them, a shorter last or resumed segment included.
    The loop is a ``while_loop`` over the same generation step as ``lax.scan``'s: the same bits."""

    count: Any
    capacity: int


def evolve_checked(
    strategy: Strategy, fitness: Fitness, state: State, num_generations: int | Generations, mesh: Mesh,
    execution: Execution, stop: Callable[[], bool] | None = None,
) -> tuple[State, Metrics]:
    """``evolve`` once its arguments passed ``check_evolve_args`` (``es.run``'s segments, a one-run sweep);
    ``fitness`` is an adapter (``es.fitness.adapter``). A fitness on the host runs generation by generation
    (``es.engine.host_loop``), and returns early after a generation where ``stop()`` is true (``es.run``'s
    signals); a JAX fitness runs the whole call as one program (``Generations``: a program for its capacity)."""
    if fitness.on_host:
        from es.engine.host_loop import evolve_on_host

        return evolve_on_host(strategy, fitness, state, count_of(num_generations), mesh, execution, stop)
    state = replicate(state, mesh)
    hp = strategy.hyperparameters(Layout.of(state.params).dim)
    static, count = program_generations(num_generations)
    state, metrics = _evolve_compiled(strategy.program(), fitness, mesh, execution, static, hp, state, count)
    return state, first_rows(metrics, num_generations)


def count_of(num_generations: int | Generations) -> int:
    """The number of generations a call runs."""
    return int(num_generations.count if isinstance(num_generations, Generations) else num_generations)


def program_generations(num_generations: int | Generations) -> tuple[int, np.int32 | None]:
    """``(static, count)`` of a generations program's call: ``(n, None)`` for an int (a scan of ``n``), or a
    ``Generations``' ``(capacity, count)`` (a loop of ``count`` in a program for ``capacity``)."""
    if isinstance(num_generations, Generations):
        return num_generations.capacity, np.int32(num_generations.count)
    return int(num_generations), None


def first_rows(metrics: PyTree, num_generations: int | Generations) -> PyTree:
    """The metrics of a ``Generations`` program (``capacity`` rows, leading axis) cut to the ``count`` it ran;
    a scan's as they are."""
    if not isinstance(num_generations, Generations) or num_generations.count == num_generations.capacity:
        return metrics
    return _first_rows(metrics, int(num_generations.count))


@functools.partial(jax.jit, static_argnums=1)
def _first_rows(metrics: PyTree, count: int) -> PyTree:
    return jax.tree.map(lambda rows: rows[:count], metrics)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _evolve_compiled(program, fitness, mesh, execution, num_generations, hp, state, count):
    """``num_generations`` generations; with ``count`` (traced) ``count`` of them in a program for up to
    ``num_generations`` (``program_generations``)."""
    run = functools.partial(run_generations, program, fitness, mesh, execution)
    return shard_generations(run, mesh, num_generations, count)(hp, state)


def shard_generations(run: Callable, mesh: Mesh, num_generations: int, count=None) -> Callable:
    """``run(generations, *args)`` once per device of ``mesh`` (``shard_replicated``): ``generations`` is
    ``num_generations``, or with ``count`` (traced, passed on as one more replicated input)
    ``Generations(count, num_generations)``."""
    if count is None:
        return shard_replicated(functools.partial(run, num_generations), mesh)

    def counted(*args):
        *args, traced_count = args
        return run(Generations(traced_count, num_generations), *args)

    return lambda *args: shard_replicated(counted, mesh)(*args, count)


def shard_replicated(fn: Callable, mesh: Mesh) -> Callable:
    """``fn`` run once per device of ``mesh``, inputs and outputs replicated.

    ``check_vma=False``: user fitness functions (e.g. gymnax rollouts) contain
    loops whose carries start from constants, which the varying-manual-axes
    check would reject; replication of the outputs holds by construction
    (every device computes the same update from the same gathered fitnesses).
    """
    return jax.shard_map(fn, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)


def run_generations(program, fitness, mesh, execution, num_generations, hp, state, gather: bool = True):
    """``num_generations`` generations in a ``lax.scan`` (inside the ``shard_map``).

    Where the update is split (``execution.shard_update``) the scan carries
    this device's slices of the private state (``es.engine.update.split``),
    gathered at the end unless ``gather`` is false (``es.collectives_report``'s
    program of one generation).
    """
    layout = Layout.of(state.params)
    noise_aux = program.noise.prepare(layout)
    step = functools.partial(generation_step, program, fitness, mesh, execution, noise_aux, execution.criteria, hp)
    return scan_generations(mesh, execution, layout.dim, step, num_generations, state, gather=gather)


def scan_generations(mesh, execution, dim, step, num_generations, state, batched=False, gather=True):
    """``step`` scanned ``num_generations`` times (an int, or ``Generations``) from ``state``: ``(state,
    metrics)``, on this device's carry where the update is split (``batched``: several runs stacked, as
    ``es.evolve_many`` has them)."""
    part = Partition(dim, mesh.size if execution.shard_update else 1, BLOCK)

    def run(carry):
        if isinstance(num_generations, Generations):
            return loop_generations(step, carry, num_generations)
        return jax.lax.scan(lambda s, _: step(s), carry, length=num_generations)

    return update.run_split(state, part, mesh.axis_names, run, batched=batched, gather=gather)


def loop_generations(step: Callable, carry: PyTree, generations: Generations) -> tuple[PyTree, PyTree]:
    """``step`` run ``generations.count`` times from ``carry`` in a ``while_loop``: ``(carry, metrics)``, each
    metric ``[capacity, ...]`` with the first ``count`` rows written (zeros after them)."""
    shapes = jax.eval_shape(step, carry)[1]
    rows = jax.tree.map(lambda s: jnp.zeros((generations.capacity, *s.shape), s.dtype), shapes)

    def body(loop):
        i, carry, rows = loop
        carry, metrics = step(carry)
        rows = jax.tree.map(lambda r, m: jax.lax.dynamic_update_index_in_dim(r, m, i, 0), rows, metrics)
        return i + 1, carry, rows

    count = jnp.asarray(generations.count, jnp.int32)
    _, carry, rows = jax.lax.while_loop(lambda loop: loop[0] < count, body, (jnp.zeros((), jnp.int32), carry, rows))
    return carry, rows
