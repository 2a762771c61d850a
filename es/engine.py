"""The ES engine: generations in ``lax.scan``, the population ``shard_map``ped over a mesh.

One generation, as every device runs it inside ``shard_map``::

    device d of n                                   every device
    ------------------------------                  ---------------------------------
    members [d*P/n, (d+1)*P/n)                       fitness f32[P]  (all-gathered)
      rebuild noise from shared keys        --->     shape -> weights f32[P]
        (an antithetic pair: one draw)               rebuild all noise in chunks,
      evaluate fitness_fn (vmap, batched)            summed in one fused loop each
      local fitness f32[P/n]  ----all-gather---->    gradient f32[D] -> optax step

Only the ``P`` fitness scalars (plus the per-member statistics of a
``StatefulFitness``) cross devices in the default ``exchange="fitness"`` mode.
Every device then performs the identical update, so the state stays replicated
and results do not depend on the number of devices.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from es import population, shaping
from es.batching import (
    default_eval_batch_size,
    default_update_batch_size,
    index_range,
    map_chunks,
    sum_in_batches,
)
from es.distributed import replicate
from es.fitness import FitnessRef, StatefulFitness, check_fitness_output
from es.mesh import resolve_mesh
from es.strategy import OpenES, OpenESState, check_key, check_params, is_int

PyTree = Any
Metrics = dict[str, jax.Array]

METRIC_NAMES = (
    "fitness_mean",  # mean of the generation's valid fitnesses
    "fitness_std",  # their standard deviation
    "fitness_max",
    "fitness_min",
    "best_fitness",  # best valid fitness seen so far in the run
    "num_invalid",  # members whose fitness was NaN or +-inf (int32)
    "grad_norm",  # L2 norm of the gradient estimate g (before weight decay)
    "update_norm",  # L2 norm of the optimizer's update
    "params_norm",  # L2 norm of the mean after the update
    "sigma",  # perturbation scale used this generation
)


def evolve(
    strategy: OpenES,
    fitness_fn: Callable,
    state: OpenESState,
    num_generations: int,
    mesh: Mesh | None = None,
) -> tuple[OpenESState, Metrics]:
    """Run ``num_generations`` generations of ``strategy`` from ``state``.

    Pure: may be called under ``jax.jit``. Calling it again continues the run;
    two calls of ``n`` generations equal one call of ``2n`` bit for bit.

    Args:
      strategy: an ``es.OpenES``.
      fitness_fn: ``(params, key) -> scalar`` for one member (or an
        ``es.StatefulFitness``); higher is better when ``strategy.maximize``.
      state: from ``strategy.init`` or a previous ``evolve``.
      num_generations: a Python int >= 0 (static: the scan length).
      mesh: the devices to shard the population over (``es.make_mesh()``,
        which spans every process after ``es.distributed.initialize``);
        ``None`` runs on this process's default device.

    Returns:
      ``(state, metrics)``: the new state, replicated on the mesh, and a dict
      of arrays with leading axis ``num_generations`` (see ``METRIC_NAMES``).
      On a mesh spanning processes both are global arrays that every process
      can read (``np.asarray``, ``es.distributed.fetch``).
    """
    mesh = check_evolve_args(strategy, fitness_fn, state, num_generations, mesh)
    state = replicate(state, mesh)
    return _evolve_compiled(strategy, FitnessRef(fitness_fn), mesh, int(num_generations), state)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _evolve_compiled(strategy, fitness, mesh, num_generations, state):
    run = functools.partial(_run_generations, strategy, fitness, mesh, num_generations)
    return _shard_replicated(run, mesh)(state)


def _shard_replicated(fn: Callable, mesh: Mesh) -> Callable:
    """``fn`` run once per device of ``mesh``, inputs and outputs replicated.

    ``check_vma=False``: user fitness functions (e.g. gymnax rollouts) contain
    loops whose carries start from constants, which the varying-manual-axes
    check would reject; replication of the outputs holds by construction
    (every device computes the same update from the same gathered fitnesses).
    """
    return jax.shard_map(fn, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)


def _run_generations(strategy, fitness, mesh, num_generations, state):
    noise_aux = strategy.noise.prepare(num_params(state.params))
    step = functools.partial(generation_step, strategy, fitness, mesh, noise_aux)
    return jax.lax.scan(lambda s, _: step(s), state, length=num_generations)


def generation_step(
    strategy: OpenES, fitness: FitnessRef, mesh: Mesh, noise_aux: Any, state: OpenESState
) -> tuple[OpenESState, Metrics]:
    """One generation on one device (the body of the ``shard_map``).

    Its phases run under ``jax.named_scope``s (``es_evaluate``, ``es_noise``,
    ``es_fitness``, ``es_exchange``, ``es_update``, ``es_optimizer``) that
    profiles and HLO dumps show (``experiments/bench/profile.py``).
    """
    axes = mesh.axis_names
    flat, unravel = ravel_pytree(state.params)
    dim = flat.shape[0]
    eval_batch = strategy.eval_batch_size or default_eval_batch_size(strategy.popsize, dim, strategy.antithetic)
    update_batch = strategy.update_batch_size or default_update_batch_size(dim)
    sigma = strategy.sigma_at(state.generation)
    gen_key = population.generation_key(state.key, state.generation)
    perturb = functools.partial(_perturb, flat, unravel, sigma)

    # 1. Evaluate this device's members, rebuilding their noise from shared keys.
    local_size = strategy.popsize // mesh.size
    local_members = index_range(jax.lax.axis_index(axes) * local_size, local_size)
    with jax.named_scope("es_evaluate"):
        local_fitness, local_stats = evaluate_members(
            strategy,
            fitness,
            noise_aux,
            gen_key,
            (flat, unravel, sigma),
            state.fitness_state,
            local_members,
            eval_batch,
            pairs=evaluates_pairs(strategy, local_size, eval_batch),
        )

    # 2. Exchange: popsize fitness scalars (and per-member stats) cross devices.
    with jax.named_scope("es_exchange"):
        all_fitness, all_stats = jax.lax.all_gather((local_fitness, local_stats), axes, tiled=True)
        # The barrier keeps XLA from fusing what follows into the (device-count
        # dependent) evaluation, so the update compiles the same on every mesh.
        all_fitness, all_stats = jax.lax.optimization_barrier((all_fitness, all_stats))

    # 3. Shape fitnesses into weights (identical on every device).
    weights, valid = shaping.shape_fitness(all_fitness, strategy.fitness_shaping, strategy.maximize)

    # 4. Rebuild the perturbations in chunks to form the gradient estimate g.
    with jax.named_scope("es_update"):
        weighted_noise = _weighted_noise_sum(
            strategy, noise_aux, gen_key, weights, local_members, dim, update_batch
        )
        if strategy.exchange == "gradient":
            with jax.named_scope("es_exchange"):
                weighted_noise = jax.lax.psum(weighted_noise, axes)
        grad = weighted_noise / (strategy.popsize * sigma)
        grad = jnp.where(jnp.isfinite(grad), grad, 0.0)

    # 5. Optimizer step on -g (optax minimises) plus L2 weight decay.
    with jax.named_scope("es_optimizer"):
        loss_grad = -grad + strategy.weight_decay * flat.astype(jnp.float32)
        updates, opt_state = strategy.optimizer.update(
            unravel(loss_grad.astype(flat.dtype)), state.opt_state, state.params
        )
        params = optax.apply_updates(state.params, updates)

    def member_params(member):
        index = population.noise_index(member, strategy.antithetic)
        eps = strategy.noise.sample(noise_aux, population.noise_key(gen_key, index), dim)
        return perturb(population.noise_sign(member, strategy.antithetic), eps)

    best_params, best_fitness = _track_best(strategy, state, all_fitness, valid, member_params)
    fitness_state = state.fitness_state
    if fitness.stateful:
        fitness_state = fitness.fn.update(fitness_state, all_stats)
    new_state = OpenESState(
        params=params,
        opt_state=opt_state,
        key=state.key,
        generation=state.generation + 1,
        best_params=best_params,
        best_fitness=best_fitness,
        fitness_state=fitness_state,
    )
    metrics = {
        **_fitness_metrics(all_fitness, valid),
        "best_fitness": best_fitness,
        "grad_norm": jnp.linalg.norm(grad),
        "update_norm": optax.tree.norm(updates),
        "params_norm": optax.tree.norm(params),
        "sigma": sigma,
    }
    return new_state, {name: metrics[name] for name in METRIC_NAMES}


def _perturb(flat, unravel, sigma, sign, eps):
    """The params pytree ``theta + sigma * sign * eps`` (``sign`` is +1 or -1)."""
    return unravel((flat.astype(jnp.float32) + sigma * sign * eps).astype(flat.dtype))


def _noise_vectors(strategy, noise_aux, gen_key, indices, dim):
    """float32[len(indices), dim]: the noise vectors with those indices."""
    keys = jax.vmap(population.noise_key, in_axes=(None, 0))(gen_key, indices)
    return jax.vmap(strategy.noise.sample, in_axes=(None, 0, None))(noise_aux, keys, dim)


def evaluates_pairs(strategy: OpenES, num_members: int, batch: int) -> bool:
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


def evaluate_members(strategy, fitness, noise_aux, gen_key, mean, fitness_state, members, batch, pairs):
    """``(fitness float32[n], stats)`` of the consecutive ``members``.

    ``mean`` is ``(flat, unravel, sigma)``: the raveled mean, its unravel
    function and this generation's sigma. Members are evaluated ``batch`` at
    a time by one vmapped call of the fitness function, whose shape is the
    same on every mesh. ``pairs`` (see ``evaluates_pairs``; needs ``members``
    to start at an even index) draws each antithetic pair's noise once; the
    results are identical.
    """
    antithetic = strategy.antithetic
    perturb = functools.partial(_perturb, *mean)
    dim = mean[0].shape[0]
    evaluate = jax.vmap(fitness.evaluate, in_axes=(0, 0, None))

    def evaluate_chunk(chunk):
        if pairs:  # chunk = (2j, 2j+1, 2j+2, ...): one draw per pair
            eps = _noise_vectors(strategy, noise_aux, gen_key, population.noise_index(chunk[0::2], True), dim)
            eps = jnp.broadcast_to(eps[:, None], (eps.shape[0], 2, dim)).reshape(chunk.shape[0], dim)
        else:
            eps = _noise_vectors(strategy, noise_aux, gen_key, population.noise_index(chunk, antithetic), dim)
        params = jax.vmap(perturb)(population.noise_sign(chunk, antithetic), eps)
        keys = jax.vmap(population.eval_key, in_axes=(None, 0))(gen_key, chunk)
        with jax.named_scope("es_fitness"):
            return evaluate(params, keys, fitness_state)

    return map_chunks(evaluate_chunk, members, batch)


def _weighted_noise_sum(strategy, noise_aux, gen_key, weights, local_members, dim, batch):
    """``sum_i w_i * sign_i * eps_i`` (float32[dim]) over the members this device sums.

    ``exchange="fitness"``: all members, grouped by noise vector (an antithetic
    pair contributes ``(w_+ - w_-) * eps_j``). ``exchange="gradient"``: only
    this device's members; the caller all-reduces the result.
    """
    antithetic = strategy.antithetic
    if strategy.exchange == "fitness":
        members = jnp.arange(strategy.popsize, dtype=jnp.int32)
    else:
        members = local_members
    if antithetic and members.shape[0] % 2 == 0:
        # Members come in whole pairs (2j, 2j + 1): one noise vector per pair.
        coefs = weights[members[0::2]] - weights[members[1::2]]
        indices = population.noise_index(members[0::2], antithetic)
    else:
        coefs = weights[members] * population.noise_sign(members, antithetic)
        indices = population.noise_index(members, antithetic)

    def chunk_sum(chunk):
        chunk_coefs, chunk_indices = chunk
        keys = jax.vmap(population.noise_key, in_axes=(None, 0))(gen_key, chunk_indices)
        return strategy.noise.weighted_sum(noise_aux, keys, chunk_coefs, dim)

    return sum_in_batches(chunk_sum, (coefs, indices), batch, jnp.zeros((dim,), jnp.float32))


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


def check_evolve_args(strategy, fitness_fn, state, num_generations, mesh) -> Mesh:
    """Validate ``evolve``'s arguments before any compilation; return the mesh to use."""
    if not isinstance(strategy, OpenES):
        raise TypeError(f"strategy must be an es.OpenES, got {type(strategy).__name__}.")
    if not callable(fitness_fn):
        raise TypeError(
            f"fitness_fn must be callable as fitness_fn(params, key) -> scalar, got {type(fitness_fn).__name__}."
        )
    if not is_int(num_generations):
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
    check_state(strategy, fitness_fn, state)
    check_fitness_output(fitness_fn, state.params, state.key, state.fitness_state)
    dim = num_params(state.params)
    strategy.noise.check(dim)
    if callable(strategy.fitness_shaping):
        out = jax.eval_shape(strategy.fitness_shaping, jax.ShapeDtypeStruct((strategy.popsize,), jnp.float32))
        if getattr(out, "shape", None) != (strategy.popsize,):
            raise TypeError(
                f"fitness_shaping callable must map float32[{strategy.popsize}] to float32[{strategy.popsize}], "
                f"got {jax.tree.map(lambda x: x.shape, out)}."
            )
    if callable(strategy.sigma):
        check_sigma_schedule(strategy)
    return mesh


def check_sigma_schedule(strategy: OpenES) -> None:
    """Raise ``TypeError`` unless ``strategy.sigma`` maps an int32 scalar generation to a float scalar."""
    fix = "a schedule must return one float per generation, e.g. optax.exponential_decay(0.1, 100, 0.5)"
    try:
        out = jax.eval_shape(strategy.sigma_at, jax.ShapeDtypeStruct((), jnp.int32))
    except Exception as error:  # whatever tracing the user's schedule raises
        raise TypeError(
            f"OpenES(sigma={strategy.sigma!r}): calling the sigma schedule on an int32 scalar generation "
            f"failed ({type(error).__name__}: {error}); {fix}."
        ) from error
    if out.shape != () or not jnp.issubdtype(out.dtype, jnp.floating):
        raise TypeError(
            f"OpenES(sigma={strategy.sigma!r}): the sigma schedule returns {out.dtype}{list(out.shape)} for an "
            f"int32 scalar generation, not a float scalar; {fix}."
        )


def _abstract(tree: PyTree) -> PyTree:
    return jax.tree.map(lambda x: (tuple(jnp.shape(x)), jnp.result_type(x)), tree)


def check_state(strategy: OpenES, fitness_fn, state) -> None:
    """Raise ``ValueError``/``TypeError`` unless ``state`` belongs to ``strategy``."""
    if not isinstance(state, OpenESState):
        raise TypeError(
            f"state must be an es.OpenESState from strategy.init(key, params), got {type(state).__name__}."
        )
    check_params(state.params, "state.params")
    check_key(state.key)
    expected = jax.eval_shape(strategy.optimizer.init, state.params)
    if jax.tree.structure(expected) != jax.tree.structure(state.opt_state) or _abstract(
        expected
    ) != _abstract(state.opt_state):
        raise ValueError(
            "state.opt_state does not match strategy.optimizer: the state was made by a different "
            "strategy (another optimizer) or for other params. Create it with "
            "strategy.init(key, params) using this strategy."
        )
    if jax.tree.structure(state.best_params) != jax.tree.structure(state.params):
        raise ValueError("state.best_params does not match state.params; create the state with strategy.init.")
    stateful = isinstance(fitness_fn, StatefulFitness)
    if stateful and state.fitness_state is None:
        raise ValueError(
            "fitness_fn is a StatefulFitness but state.fitness_state is None; create the state with "
            "strategy.init(key, params, fitness=fitness_fn)."
        )
    if stateful:
        expected_fs = jax.eval_shape(fitness_fn.init)
        if jax.tree.structure(expected_fs) != jax.tree.structure(state.fitness_state):
            raise ValueError(
                "state.fitness_state does not match fitness_fn.init(); create the state with "
                "strategy.init(key, params, fitness=fitness_fn)."
            )
