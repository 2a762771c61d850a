"""The ES engine: generations in ``lax.scan``, the population ``shard_map``ped over a mesh.

One generation, as every device runs it inside ``shard_map``::

    device d of n                                   every device
    ------------------------------                  ---------------------------------
    members [d*P/n, (d+1)*P/n)                       fitness f32[P]  (all-gathered)
      rebuild noise from shared keys        --->     strategy: fitness -> coefficients
        (an antithetic pair: one draw)               rebuild all noise in chunks:
      evaluate fitness_fn (vmap, batched)              sums of a_i s_i eps_i, b_i eps_i^2
      local fitness f32[P/n]  ----all-gather---->    strategy: sums -> new mean, state

Only the ``P`` fitness scalars (plus the per-member statistics of a
``StatefulFitness``) cross devices in the default ``exchange="fitness"`` mode.
Every device then performs the identical update, so the state stays replicated
and results do not depend on the number of devices. ``exchange="sharded"``
splits the sums instead: device ``d`` rebuilds only its ``1/n`` slice of the
coordinates of every member's noise, and the slices are all-gathered, with
the same bits. The strategy (``es/strategies/base.py``) supplies only the maths of
steps 3 and 5; ``docs/scaling.md`` compares the modes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from es import validation
from es.engine import partition as coordinates
from es.engine import members as population
from es.engine import update as sharded_update
from es.engine.partition import Partition, slice_size
from es.noise.layout import Layout
from es.engine.batching import (
    default_update_batch_size,
    index_range,
    map_chunks,
    sum_in_batches,
)
from es.parallel.distributed import replicate
from es.fitness.functions import FitnessRef, adapter
from es.parallel.mesh import resolve_mesh
from es.strategies.base import Coefficients, State, Strategy, Sums

PyTree = Any
Metrics = dict[str, jax.Array]

EXCHANGE_MODES = ("fitness", "sharded", "gradient", "auto")
"""The accepted ``exchange=`` values; ``"auto"`` resolves to ``"sharded"`` or ``"fitness"`` (``resolve_exchange``)."""

METRIC_NAMES = (
    "fitness_mean",  # mean of the generation's valid fitnesses
    "fitness_std",  # their standard deviation
    "fitness_max",
    "fitness_min",
    "best_fitness",  # best valid fitness seen so far in the run
    "num_invalid",  # members whose fitness was NaN or +-inf (int32)
    "grad_norm",  # L2 norm of the strategy's ascent direction for the mean
    "update_norm",  # L2 norm of the change it made to the mean
    "params_norm",  # L2 norm of the mean after the update
    "sigma",  # mean perturbation scale used this generation (over coordinates)
)


@dataclasses.dataclass(frozen=True)
class Execution:
    """How a run executes (static; resolved by ``check_evolve_args``).

    Attributes:
      exchange: ``"fitness"`` (only fitnesses cross devices; every device
        rebuilds every member's noise for the update; bit-identical on any
        device count), ``"sharded"`` (each device rebuilds its ``1/n`` slice
        of the coordinates of every member's noise and the slices of the sums
        are all-gathered; the same bits as ``"fitness"``) or ``"gradient"``
        (each device sums its own members and the params-sized sums are
        all-reduced; rounding depends on the device count).
      eval_batch_size: members evaluated together by one vmapped call.
      update_batch_size: noise vectors rebuilt per step of the sums.
      shard_update: ``"sharded"`` with a coordinatewise strategy and ``D``
        large enough to split: each device also updates only its slice of
        the coordinates and keeps its slice of the optimizer state and best
        params between generations (``es/engine/update.py``).
    """

    exchange: str
    eval_batch_size: int
    update_batch_size: int
    shard_update: bool = False

    def identity(self, num_devices: int) -> dict:
        """What of the execution determines a run's results (JSON): a resume must not change it.

        The batch sizes fix the shapes and the summation order. The device
        count matters only for ``"gradient"``, whose all-reduce rounds by device.
        """
        identity = {"eval_batch_size": self.eval_batch_size, "update_batch_size": self.update_batch_size}
        if self.exchange == "gradient":
            identity["gradient_exchange_devices"] = num_devices
        return identity


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
) -> tuple[State, Metrics]:
    """Run ``num_generations`` generations of ``strategy`` from ``state``.

    Pure: may be called under ``jax.jit``. Calling it again continues the run;
    two calls of ``n`` generations equal one call of ``2n`` bit for bit.

    Args:
      strategy: ``es.OpenES``, ``es.SNES``, ``es.PGPE``, ``es.ARS``,
        ``es.SepCMAES`` or your own ``es.Strategy``.
      fitness_fn: ``(params, key) -> scalar`` for one member (or an
        ``es.StatefulFitness``); higher is better when ``strategy.maximize``.
        An ``es.HostFitness`` runs a Python (non-JAX) fitness in worker
        processes; ``evolve`` then returns once the call has run, and raises
        ``es.FitnessError`` if an evaluation failed (see its docs).
      state: from ``strategy.init`` or a previous ``evolve``.
      num_generations: a Python int >= 0 (static: the scan length).
      mesh: the devices to shard the population over (``es.make_mesh()``,
        which spans every process after ``es.distributed.initialize``);
        ``None`` runs on this process's default device.
      exchange: ``"fitness"`` (default), ``"sharded"``, ``"gradient"`` or
        ``"auto"``; see ``Execution``, ``es.exchange_report`` and
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

    Peak memory is ``O((eval_batch_size + update_batch_size) * num_params)``,
    independent of popsize.

    Returns:
      ``(state, metrics)``: the new state, replicated on the mesh, and a dict
      of arrays with leading axis ``num_generations`` (see ``METRIC_NAMES``).
      On a mesh spanning processes both are global arrays that every process
      can read (``np.asarray``, ``es.distributed.fetch``).
    """
    mesh, execution = check_evolve_args(
        strategy, fitness_fn, state, num_generations, mesh, exchange, eval_batch_size, update_batch_size
    )
    return evolve_checked(strategy, fitness_fn, state, num_generations, mesh, execution)


def evolve_checked(
    strategy: Strategy, fitness_fn: Callable, state: State, num_generations: int, mesh: Mesh, execution: Execution
) -> tuple[State, Metrics]:
    """``evolve`` once its arguments passed ``check_evolve_args`` (``es.run``'s segments, a one-run sweep)."""
    state = replicate(state, mesh)
    fitness = adapter(fitness_fn)
    return fitness.dispatch(
        lambda: _evolve_compiled(strategy, fitness, mesh, execution, int(num_generations), state), state
    )


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _evolve_compiled(strategy, fitness, mesh, execution, num_generations, state):
    run = functools.partial(run_generations, strategy, fitness, mesh, execution, num_generations)
    return shard_replicated(run, mesh)(state)


def shard_replicated(fn: Callable, mesh: Mesh) -> Callable:
    """``fn`` run once per device of ``mesh``, inputs and outputs replicated.

    ``check_vma=False``: user fitness functions (e.g. gymnax rollouts) contain
    loops whose carries start from constants, which the varying-manual-axes
    check would reject; replication of the outputs holds by construction
    (every device computes the same update from the same gathered fitnesses).
    """
    return jax.shard_map(fn, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)


def run_generations(strategy, fitness, mesh, execution, num_generations, state, gather: bool = True):
    """``num_generations`` generations in a ``lax.scan`` (inside the ``shard_map``).

    With ``execution.shard_update`` the scan carries this device's slices of
    the private state (``sharded_update.split``), gathered at the end unless
    ``gather`` is false (``es.collectives_report``'s program of one generation).
    """
    layout = Layout.of(state.params)
    noise_aux = strategy.noise.prepare(layout)
    step = functools.partial(generation_step, strategy, fitness, mesh, execution, noise_aux)
    return scan_generations(strategy, mesh, execution, layout.dim, step, num_generations, state, gather=gather)


def scan_generations(strategy, mesh, execution, dim, step, num_generations, state, batched=False, gather=True):
    """``step`` scanned ``num_generations`` times from ``state``: ``(state, metrics)``.

    With ``execution.shard_update`` the scan runs on this device's carry
    (``sharded_update.run_split``; ``batched``: several runs stacked, as
    ``es.evolve_many`` has them), gathered back at the end unless ``gather``
    is false.
    """

    def run(carry):
        return jax.lax.scan(lambda s, _: step(s), carry, length=num_generations)

    if not execution.shard_update:
        return run(state)
    part = Partition(dim, mesh.size, coordinates.BLOCK)
    return sharded_update.run_split(strategy, state, part, mesh.axis_names, run, batched=batched, gather=gather)


def generation_step(
    strategy: Strategy, fitness: Any, mesh: Mesh, execution: Execution, noise_aux: Any, state: State
) -> tuple[State, Metrics]:
    """One generation on one device (the body of the ``shard_map``).

    Its phases run under ``jax.named_scope``s (``es_evaluate``, ``es_noise``,
    ``es_fitness``, ``es_exchange``, ``es_update``, ``es_optimizer``) that
    profiles and HLO dumps show (``experiments/bench/profile.py``).
    ``fitness`` is an adapter with ``evaluate(population, members,
    fitness_state, pairs)``: ``FitnessRef`` for a fitness function,
    ``es.HostFitness`` for one evaluated in worker processes, or the given
    values of ``es.tell``.
    """
    members = this_generation(strategy, noise_aux, state)

    # 1. Evaluate this device's members, rebuilding their noise from shared keys.
    local_members, (local_fitness, local_stats) = evaluate_local(strategy, fitness, mesh, execution, members, state)

    # 2. Exchange: popsize fitness scalars (and per-member stats) cross devices.
    with jax.named_scope("es_exchange"):
        all_fitness, all_stats = jax.lax.all_gather((local_fitness, local_stats), mesh.axis_names, tiled=True)
        # The barrier keeps XLA from fusing what follows into the (device-count
        # dependent) evaluation, so the update compiles the same on every mesh.
        all_fitness, all_stats = jax.lax.optimization_barrier((all_fitness, all_stats))

    # 3. Shape: the strategy turns the fitnesses into per-member coefficients.
    coefficients = strategy.coefficients(state.strategy_state, all_fitness)
    valid = jnp.isfinite(jnp.asarray(all_fitness, jnp.float32))

    def track_best(member_params):
        return _track_best(strategy, state, all_fitness, valid, member_params)

    if sharded_update.applies(strategy, members.dim):  # 4-5 on this device's slice, or all (es/engine/update.py)
        part = Partition(members.dim, mesh.size if execution.shard_update else 1, coordinates.BLOCK)
        with jax.named_scope("es_update"):
            if part.split:
                sums = slice_sums(members, coefficients, part, mesh, execution.update_batch_size)
            else:
                sums = exchanged_sums(members, coefficients, local_members, mesh, execution)
        with jax.named_scope("es_optimizer"):
            params, strategy_state, best, norms = sharded_update.update(
                strategy, part, mesh.axis_names, members, state, coefficients, sums, jnp.any(valid), track_best)
        return record(strategy, fitness, members, state, all_fitness, all_stats, params, strategy_state, best, norms)

    # 4. Rebuild the sums it asks for from the shared keys, in chunks (all of them, a slice, or our members').
    with jax.named_scope("es_update"):
        sums = exchanged_sums(members, coefficients, local_members, mesh, execution)

    # 5. The strategy's update (skipped without a valid member, or if it is not finite).
    with jax.named_scope("es_optimizer"):
        params, strategy_state, vectors = strategy.update(state, coefficients, sums)
        params, strategy_state = keep_if_finite((params, strategy_state), (state.params, state.strategy_state),
                                                jnp.any(valid))
    norms = {"grad_norm": vector_norm(vectors["grad_norm"]), "update_norm": vector_norm(vectors["update_norm"]),
             "params_norm": optax.tree.norm(params)}
    best = track_best(members.member)
    return record(strategy, fitness, members, state, all_fitness, all_stats, params, strategy_state, best, norms)


def evaluate_local(strategy: Strategy, fitness: Any, mesh: Mesh, execution: Execution,
                   members: population.Generation, state: State) -> tuple[jax.Array, tuple[jax.Array, PyTree]]:
    """Step 1 of a generation: this device's share of the members, evaluated ``eval_batch_size`` at a time.

    Returns ``(local_members, (local_fitness, local_stats))``: the member
    indices ``int32[popsize / mesh.size]``, their fitnesses (float32) and
    per-member statistics (``()`` unless the fitness is stateful).
    """
    local_size = strategy.popsize // mesh.size
    local_members = index_range(jax.lax.axis_index(mesh.axis_names) * local_size, local_size)
    batch = execution.eval_batch_size
    with jax.named_scope("es_evaluate"):
        pairs = evaluates_pairs(strategy, local_size, batch)
        evaluated = map_chunks(
            lambda chunk: fitness.evaluate(members, chunk, state.fitness_state, pairs), local_members, batch
        )
    return local_members, evaluated


def this_generation(strategy: Strategy, noise_aux: Any, state: State) -> population.Generation:
    """The members of the generation that ``state`` is about to run (rebuilt on demand)."""
    scale = strategy.scale(state.strategy_state, state.generation)
    gen_key = population.generation_key(state.key, state.generation)
    return population.Generation(
        strategy.noise, noise_aux, gen_key, state.params, scale, strategy.antithetic, state.generation
    )


def evaluates_pairs(strategy: Strategy, num_members: int, batch: int) -> bool:
    """Whether ``num_members`` members (from an even index) are evaluated pair by pair.

    True when every micro-batch holds whole antithetic pairs and the noise
    source prefers it (``pairs_share_draws``; a PRNG draw costs far more than
    reading a table slice twice): each pair's noise vector is then drawn once
    and used with both signs, instead of once per member. Member params are
    the same bit for bit either way.
    """
    return (
        strategy.antithetic
        and strategy.noise.pairs_share_draws
        and batch % 2 == 0
        and num_members % 2 == 0
    )


def exchanged_sums(members, coefficients, local_members, mesh, execution) -> Sums:
    """The ``Sums`` of the whole population on every device, as ``execution.exchange`` forms them.

    - ``"fitness"``: every device sums every member over all ``D`` coordinates.
    - ``"sharded"``: device ``d`` sums every member over its slice of ``S =
      slice_size(D, n)`` coordinates (``es.coordinates.Partition``), and the
      slices are all-gathered and put back in order: the same additions in
      the same order as ``"fitness"``, so the same bits. When ``S = D``
      (``D`` below ``MIN_SLICE``) it is ``"fitness"``. (Where a
      coordinatewise update is split, ``Execution.shard_update``,
      ``generation_step`` sums its own slice instead.)
    - ``"gradient"``: every device sums its own members; the sums are
      all-reduced (the grouping of the additions follows the mesh).
    """
    batch = execution.update_batch_size
    if execution.exchange == "gradient":
        sums = rebuild_sums(members, coefficients, local_members, batch)
        with jax.named_scope("es_exchange"):
            return jax.lax.psum(sums, mesh.axis_names)
    part = Partition(members.dim, mesh.size)
    if execution.exchange == "fitness" or not part.split:
        everyone = jnp.arange(coefficients.linear.shape[0], dtype=jnp.int32)
        return rebuild_sums(members, coefficients, everyone, batch)
    slices = slice_sums(members, coefficients, part, mesh, batch)
    with jax.named_scope("es_exchange"):
        gathered = jax.lax.all_gather(slices, mesh.axis_names, tiled=True)
    return jax.tree.map(part.assemble, gathered)


def slice_sums(members, coefficients, part: Partition, mesh: Mesh, batch: int) -> Sums:
    """``Sums`` of every member over this device's slice of ``part``'s coordinates."""
    everyone = jnp.arange(coefficients.linear.shape[0], dtype=jnp.int32)
    start = part.start(jax.lax.axis_index(mesh.axis_names))
    return rebuild_sums(members, coefficients, everyone, batch, start, part.size)


def rebuild_sums(
    members: population.Generation, coefficients: Coefficients, summed: jax.Array, batch: int,
    start: int | jax.Array = 0, size: int | None = None,
) -> Sums:
    """``Sums`` over the consecutive members ``summed``, accumulated chunk by chunk in member order.

    Over coordinates ``[start, start + size)`` (default: all ``D``). With
    antithetic pairs (``summed`` of even length from an even index) each
    noise vector is rebuilt once: pair ``j`` contributes ``(a_2j - a_2j+1) *
    eps_j`` and ``(b_2j + b_2j+1) * eps_j**2``.
    """
    linear, square = coefficients
    antithetic = members.antithetic
    if antithetic and summed.shape[0] % 2 == 0:
        first, second = summed[0::2], summed[1::2]
        linear = linear[first] - linear[second]
        square = None if square is None else square[first] + square[second]
        indices = population.noise_index(first, antithetic)
    else:
        linear = linear[summed] * population.noise_sign(summed, antithetic)
        square = None if square is None else square[summed]
        indices = population.noise_index(summed, antithetic)

    size = members.dim if size is None else size

    def chunk_sums(chunk):
        chunk_linear, chunk_square, chunk_indices = chunk
        keys = members.noise_keys(chunk_indices)
        return members.noise.sums(members.aux, keys, chunk_linear, chunk_square, members.layout, start, size)

    zeros = jnp.zeros((size,), jnp.float32)
    init = (zeros, None if square is None else zeros)
    return Sums(*sum_in_batches(chunk_sums, (linear, square, indices), batch, init))


def vector_norm(value) -> jax.Array:
    """The norm of what a strategy's ``update`` reports: a vector (``jnp.linalg.norm``), a pytree
    (``optax.tree.norm``) or a norm already (a scalar). The replicated update's metrics; where the update can
    be split (``sharded_update.applies``) the norms are ``es.coordinates``', which no mesh changes."""
    if not jax.tree_util.treedef_is_leaf(jax.tree.structure(value)):
        return optax.tree.norm(value)
    return jnp.asarray(value, jnp.float32) if jnp.ndim(value) == 0 else jnp.linalg.norm(value)


def keep_if_finite(new: PyTree, old: PyTree, accept: jax.Array) -> PyTree:
    """``new`` if ``accept`` and every float in it is finite, else ``old`` (a NaN/inf never enters the state)."""
    keep = jnp.logical_and(accept, coordinates.all_finite(new))
    return jax.tree.map(lambda a, b: jnp.where(keep, a, b), new, old)


def record(strategy, fitness, members, state, all_fitness, all_stats, params, strategy_state, best, norms):
    """The next ``State`` and this generation's metrics; ``best`` is ``_track_best``'s, ``norms`` the metrics
    ``grad_norm``, ``update_norm`` and ``params_norm``."""
    valid = jnp.isfinite(jnp.asarray(all_fitness, jnp.float32))
    best_params, best_fitness = best
    fitness_state = state.fitness_state
    if fitness.stateful:
        fitness_state = fitness.update(fitness_state, all_stats)
    new_state = State(
        params=params,
        strategy_state=strategy_state,
        key=state.key,
        generation=state.generation + 1,
        best_params=best_params,
        best_fitness=best_fitness,
        fitness_state=fitness_state,
    )
    metrics = {
        **_fitness_metrics(all_fitness, valid),
        "best_fitness": best_fitness,
        **norms,
        "sigma": jnp.mean(members.scale),
    }
    return new_state, {name: jnp.asarray(metrics[name]) for name in METRIC_NAMES}


def _track_best(strategy, state, all_fitness, valid, member_params):
    """The best member so far: rebuilt from its key when this generation beats it."""
    better = all_fitness if strategy.maximize else -all_fitness
    score = jnp.where(valid, better, -jnp.inf)
    best = jnp.argmax(score)
    previous = state.best_fitness if strategy.maximize else -state.best_fitness
    improved = score[best] > previous
    candidate = member_params(best.astype(jnp.int32))
    best_params = jax.tree.map(lambda new, old: jnp.where(improved, new, old), candidate, state.best_params)
    best_fitness = jnp.where(improved, all_fitness[best], state.best_fitness)
    return best_params, best_fitness


def _fitness_metrics(fitness: jax.Array, valid: jax.Array) -> Metrics:
    """Mean, std, max and min over valid fitnesses (NaN if none), and the invalid count."""
    count = jnp.sum(valid)
    safe_count = jnp.maximum(count, 1)
    mean = jnp.sum(jnp.where(valid, fitness, 0.0)) / safe_count
    var = jnp.sum(jnp.where(valid, (fitness - mean) ** 2, 0.0)) / safe_count
    any_valid = count > 0
    nan = jnp.float32(jnp.nan)
    return {
        "fitness_mean": jnp.where(any_valid, mean, nan),
        "fitness_std": jnp.where(any_valid, jnp.sqrt(var), nan),
        "fitness_max": jnp.where(any_valid, jnp.max(jnp.where(valid, fitness, -jnp.inf)), nan),
        "fitness_min": jnp.where(any_valid, jnp.min(jnp.where(valid, fitness, jnp.inf)), nan),
        "num_invalid": (fitness.shape[0] - count).astype(jnp.int32),
    }


def num_params(params: PyTree) -> int:
    """Total number of scalars in ``params``."""
    return sum(int(jnp.size(x)) for x in jax.tree.leaves(params))


# --------------------------------------------------------------------------- checks


def check_evolve_args(
    strategy, fitness_fn, state, num_generations, mesh, exchange="fitness", eval_batch_size=None,
    update_batch_size=None,
) -> tuple[Mesh, Execution]:
    """Validate ``evolve``'s arguments before any compilation; return the mesh and the execution."""
    if not isinstance(strategy, Strategy):
        raise TypeError(
            f"strategy must be an es strategy (es.OpenES, es.SNES, es.PGPE, es.ARS, es.SepCMAES), "
            f"got {type(strategy).__name__}."
        )
    fitness = adapter(fitness_fn)
    if not validation.is_int(num_generations):
        raise TypeError(
            f"num_generations must be a Python int (it is the static scan length), got {num_generations!r}."
        )
    if num_generations < 0:
        raise ValueError(f"num_generations={num_generations} is negative; use 0 or more generations.")
    mesh = resolve_mesh(mesh)
    if strategy.popsize % mesh.size:
        raise ValueError(
            f"popsize={strategy.popsize} is not divisible by the mesh's {mesh.size} devices; "
            f"use a multiple of {mesh.size} (e.g. {-(-strategy.popsize // mesh.size) * mesh.size}) "
            f"or a mesh whose size divides {strategy.popsize}."
        )
    if fitness.shared_by == "pair" and not strategy.antithetic:
        raise ValueError(
            f"es.CommonRandomNumbers(shared_by='pair') shares a key within antithetic pairs, but this "
            f"{type(strategy).__name__} has antithetic=False; use shared_by='generation' or an antithetic strategy."
        )
    check_state(strategy, fitness, state)
    layout = Layout.of(state.params)
    check_noise(strategy, state, layout)
    check_fitness_input(strategy, fitness, state, layout)
    execution = resolve_execution(strategy, layout, exchange, eval_batch_size, update_batch_size, mesh.size, fitness)
    return mesh, execution


def check_noise(strategy: Strategy, state: State, layout: Layout) -> None:
    """The noise source can serve these params and this strategy (before compiling)."""
    strategy.noise.check(layout)
    strategy.check_run(layout.dim)
    if strategy.noise.factored:
        scale = jax.eval_shape(strategy.scale, state.strategy_state, state.generation)
        if scale.shape != ():
            raise ValueError(
                f"{type(strategy).__name__} perturbs each coordinate with its own scale (scale is "
                f"float32{list(scale.shape)}), but LowRankNoise(factored=True) needs one scale per member to keep "
                "A @ B.T factored; use LowRankNoise(factored=False) or a strategy with a scalar sigma."
            )


def check_fitness_input(strategy: Strategy, fitness, state: State, layout: Layout) -> None:
    """The fitness (an adapter) accepts what it will receive (``es.LowRank`` matrix leaves when factored)."""
    if not strategy.noise.factored:
        fitness.check(state.params, state.key, state.fitness_state)
        return
    if fitness.on_host:
        raise TypeError(
            "LowRankNoise(factored=True) passes es.LowRank matrix leaves, which only a JAX fitness function can "
            "take; with an es.HostFitness use LowRankNoise(factored=False), whose members are plain arrays."
        )
    example = strategy.noise.factored_example(state.params, layout)
    try:
        fitness.check(example, state.key, state.fitness_state)
    except Exception as error:  # whatever the user's code raises on an es.LowRank leaf
        raise TypeError(
            "fitness_fn fails on what LowRankNoise(factored=True) passes it: every matrix leaf (2 or more axes) "
            "arrives as an es.LowRank(base, factors, scale), not an array. Multiply by weights with "
            "es.matmul(x, w), or call w.materialise() / es.materialise(w); see docs/lowrank.md. "
            f"The error was {type(error).__name__}: {error}"
        ) from error


def resolve_exchange(strategy: Strategy, layout: Layout, num_devices: int) -> str:
    """What ``exchange="auto"`` runs: ``"sharded"`` when the update can be split (several devices, a noise
    source that can rebuild coordinate slices, and ``D`` large enough that each device gets fewer than all of
    them: ``slice_size``), else ``"fitness"``. The two give the same bits, so the choice changes only the
    cost (docs/scaling.md): ``"sharded"`` divides the update's noise work by the device count and moves
    ``4 * D`` (``8 * D`` with squared sums) more bytes per generation."""
    splits = num_devices > 1 and strategy.noise.sliceable and slice_size(layout.dim, num_devices) < layout.dim
    return "sharded" if splits else "fitness"


def resolve_execution(
    strategy, layout: Layout, exchange, eval_batch_size, update_batch_size, num_devices: int = 1, fitness=None
) -> Execution:
    """The ``Execution`` of a run: ``exchange`` checked (``"auto"`` resolved), automatic batch sizes filled in.

    ``fitness`` (an adapter, or ``None`` for a JAX fitness) picks the default
    evaluation batch: ``es.HostFitness`` evaluates each device's whole share at once.
    """
    validation.check_choice("es.evolve", "exchange", exchange, EXCHANGE_MODES)
    if exchange == "auto":
        exchange = resolve_exchange(strategy, layout, num_devices)
    if exchange == "sharded" and not strategy.noise.sliceable:
        raise ValueError(
            f"es.evolve(exchange='sharded') with {type(strategy.noise).__name__}: its update is one matrix "
            "product per chunk of members, which cannot be split into coordinate slices that round like the "
            "whole; use exchange='fitness' (or 'auto', which picks it) with low-rank noise."
        )
    eval_batch_size = validation.check_optional_int("es.evolve", "eval_batch_size", eval_batch_size)
    update_batch_size = validation.check_optional_int("es.evolve", "update_batch_size", update_batch_size)
    draw = strategy.noise.draw_size(layout)
    evaluated = draw if strategy.noise.factored else layout.dim  # floats of one member's fitness input
    if eval_batch_size is None:
        eval_batch_size = (fitness or FitnessRef).default_eval_batch_size(strategy, evaluated)
    return Execution(
        exchange=exchange,
        eval_batch_size=eval_batch_size,
        update_batch_size=update_batch_size or default_update_batch_size(draw),
        shard_update=exchange == "sharded" and sharded_update.applies(strategy, layout.dim)
        and Partition(layout.dim, num_devices, coordinates.BLOCK).split,
    )


def check_state(strategy: Strategy, fitness, state) -> None:
    """Raise ``ValueError``/``TypeError`` unless ``state`` belongs to ``strategy`` (and ``fitness``, an adapter or None)."""
    if not isinstance(state, State):
        raise TypeError(f"state must be an es.State from strategy.init(key, params), got {type(state).__name__}.")
    validation.check_params(state.params, "state.params")
    validation.check_key(state.key)
    expected = jax.eval_shape(strategy.initial_state, state.params)
    difference = validation.tree_difference(state.strategy_state, expected)
    if difference is not None:
        raise ValueError(
            f"state.strategy_state does not match this {type(strategy).__name__} for state.params: {difference}. "
            "The state was made by a different strategy (another kind, optimizer or settings) or for other "
            "params. Create it with strategy.init(key, params) using this strategy."
        )
    if jax.tree.structure(state.best_params) != jax.tree.structure(state.params):
        raise ValueError("state.best_params does not match state.params; create the state with strategy.init.")
    stateful = fitness is not None and fitness.stateful
    if stateful and state.fitness_state is None:
        raise ValueError(
            "fitness_fn is stateful (an es.StatefulFitness, or an es.HostFitness with init/update/stats) but "
            "state.fitness_state is None; create the state with strategy.init(key, params, fitness=fitness_fn)."
        )
    if stateful and jax.tree.structure(jax.eval_shape(fitness.init)) != jax.tree.structure(state.fitness_state):
        raise ValueError(
            "state.fitness_state does not match fitness_fn.init(); create the state with "
            "strategy.init(key, params, fitness=fitness_fn)."
        )
