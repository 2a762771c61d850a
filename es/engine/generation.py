"""One generation, as every device runs it inside ``shard_map``: ``generation_step``, read top to bottom.

::

    device d of n                                   every device
    ------------------------------                  ---------------------------------------------
    members [d*P/n, (d+1)*P/n)                       fitnesses f[P] (all-gathered), ranked at full precision
      rebuild noise from shared keys        --->     strategy: fitnesses -> coefficients
      evaluate the fitness (vmap, batched)           rebuild the noise in chunks: the sums of its part
      local fitnesses f[P/n]  ---all-gather--->      strategy.update on its part, norms, best member
                                                     the next state, the metrics, the stopping conditions

Only the ``P`` fitnesses (plus the per-member statistics of a ``StatefulFitness``) cross devices in the
default ``exchange="fitness"`` mode; every device then performs the identical update, so the state stays
replicated and results do not depend on the number of devices. The strategy supplies only the maths of
steps 3 and 5 (``es.strategies.base``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from es.engine import members as population
from es.engine import stopping, sums, update
from es.engine.batching import index_range, map_chunks
from es.engine.partition import BLOCK, Partition
from es.fitness import Fitnesses
from es.strategies.base import State, Strategy

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
    "stop",  # stopping conditions met after the generation (int32 bitmask over es.engine.stopping.CRITERIA;
    # 0 unless the call was given stop_criteria)
)


def generation_step(strategy: Strategy, fitness: Any, mesh: Mesh, execution, noise_aux: Any, criteria, hp,
                    state: State) -> tuple[State, dict[str, jax.Array]]:
    """One generation on one device (the body of the ``shard_map``); ``strategy`` is its ``program()``.

    ``fitness`` is an adapter (``es.fitness.Fitness``, or the given values of
    ``es.tell``/``es.evolve_many``), ``hp`` the traced hyperparameters,
    ``criteria`` the ``es.StopCriteria`` (``None``: no condition computed, no history recorded;
    ``stopping.OnTheState``: only the conditions on the state, no history recorded). The phases run under
    ``jax.named_scope``s (``es_evaluate``, ``es_noise``, ``es_fitness``,
    ``es_exchange``, ``es_update``, ``es_optimizer``) that profiles show.
    """
    members = this_generation(strategy, hp, noise_aux, state)

    # 1. Evaluate this device's members, rebuilding their noise from shared keys.
    local_members, local = evaluate_local(strategy, fitness, mesh, execution, members, state)

    # 2. Exchange: the popsize fitnesses (and per-member stats) cross devices; rank them at full precision.
    with jax.named_scope("es_exchange"):
        fitnesses, stats = jax.lax.all_gather(local, mesh.axis_names, tiled=True)
        # The barrier keeps XLA from fusing what follows into the (device-count
        # dependent) evaluation, so the update compiles the same on every mesh.
        fitnesses, stats = jax.lax.optimization_barrier((fitnesses, stats))
    ranked, valid = rank(fitnesses, strategy.maximize)

    # 3. Shape: the strategy turns the fitnesses into per-member coefficients.
    coefficients = strategy.coefficients(hp, state.strategy_state, ranked)

    # 4. Rebuild the sums it asks for from the shared keys, for this device's part of the coordinates.
    part = Partition(members.dim, mesh.size if execution.shard_update else 1, BLOCK)
    with jax.named_scope("es_update"):
        sums_ = sums.for_update(members, coefficients, part, local_members, mesh, execution)

    # 5. The update on that part (kept only if finite and some member is valid), the norms, the best member.
    with jax.named_scope("es_optimizer"):
        updated = update.apply(strategy, hp, part, mesh.axis_names, members, state, coefficients, sums_,
                               fitnesses.value, valid, ranked)
        if not execution.track_best:  # the best member's rebuild is then unused, and XLA leaves it out
            updated = updated._replace(best_params=state.best_params)

    # 6. The next state, the metrics and the stopping conditions.
    return record(strategy, hp, fitness, members, state, fitnesses, ranked, valid, stats, updated, criteria)


def this_generation(strategy: Strategy, hp, noise_aux: Any, state: State) -> population.Generation:
    """The members of the generation that ``state`` is about to run (rebuilt on demand)."""
    scale = strategy.scale(hp, state.strategy_state, state.generation)
    gen_key = population.generation_key(state.key, state.generation)
    vectors = strategy.popsize // 2 if strategy.antithetic else strategy.popsize
    return population.Generation(
        strategy.noise, noise_aux, gen_key, state.params, scale, strategy.antithetic, state.generation, vectors=vectors
    )


def evaluate_local(strategy: Strategy, fitness: Any, mesh: Mesh, execution, members: population.Generation,
                   state: State):
    """Step 1: this device's share of the members, evaluated ``eval_batch_size`` at a time.

    Returns ``(local_members, (Fitnesses, stats))``: the member indices
    ``int32[popsize / mesh.size]``, their fitnesses and per-member statistics
    (``()`` unless the fitness is stateful).
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


def evaluates_pairs(strategy: Strategy, num_members: int, batch: int) -> bool:
    """Whether ``num_members`` members (from an even index) are evaluated pair by pair.

    True when every micro-batch holds whole antithetic pairs and the noise
    source prefers it (``pairs_share_draws``; a PRNG draw costs far more than
    reading a table slice twice): each pair's noise vector is then drawn once
    and used with both signs, instead of once per member.
    """
    return strategy.antithetic and strategy.noise.pairs_share_draws and batch % 2 == 0 and num_members % 2 == 0


def rank(fitnesses: Fitnesses, maximize: bool) -> tuple[jax.Array, jax.Array]:
    """``(ranked, valid)``: the fitnesses the strategy ranks, and which are finite.

    Without a residual (every JAX fitness) ``ranked`` is ``fitnesses.value``
    itself. Values from the host carry what rounding to the fitness dtype
    dropped; they are ranked as ``(value - reference) + residual`` with the
    best valid value as the reference, so differences down to float64's
    resolution survive (every strategy is invariant to adding a constant to
    the fitness; the best, not the largest, so that minimising ``f`` and
    maximising ``-f`` shift alike). Where no residual is non-zero, ``value``
    is used as it is.
    """
    value = fitnesses.value
    valid = jnp.isfinite(value)
    if fitnesses.residual is None:
        return value, valid
    better = value if maximize else -value
    reference = value[jnp.argmax(jnp.where(valid, better, -jnp.inf))]
    shifted = (value - jnp.where(jnp.isfinite(reference), reference, 0)) + fitnesses.residual
    return jnp.where(jnp.any(fitnesses.residual != 0), shifted, value), valid


def record(strategy, hp, fitness, members, state, fitnesses, ranked, valid, stats, updated, criteria):
    """The next ``State`` and this generation's metrics (``METRIC_NAMES``)."""
    fitness_state = fitness.update_state(state.fitness_state, stats) if fitness.stateful else state.fitness_state
    history = state.stop_history  # recorded where conditions are read, and not kept elsewhere (stopping.OnTheState)
    if isinstance(criteria, stopping.StopCriteria):
        history = stopping.record(history, strategy.maximize, fitnesses.value, fitnesses.residual, ranked, valid)
    new_state = State(updated.params, updated.strategy_state, state.key, state.generation + 1, updated.best_params,
                      updated.best_fitness, fitness_state, history)
    found = {} if criteria is None else stopping.state_conditions(strategy, hp, new_state, criteria)
    metrics = {
        **fitness_metrics(fitnesses.value, valid),
        "best_fitness": updated.best_fitness,
        **updated.norms,
        "sigma": jnp.mean(stopping.coordinate_scale(members.scale)),
        "stop": stopping.bitmask(found),
    }
    return new_state, {name: jnp.asarray(metrics[name]) for name in METRIC_NAMES}


def fitness_metrics(fitness: jax.Array, valid: jax.Array) -> dict[str, jax.Array]:
    """Mean, std, max and min over valid fitnesses (NaN if none), and the invalid count."""
    count = jnp.sum(valid)
    safe_count = jnp.maximum(count, 1)
    mean = jnp.sum(jnp.where(valid, fitness, 0.0)) / safe_count
    var = jnp.sum(jnp.where(valid, (fitness - mean) ** 2, 0.0)) / safe_count
    any_valid = count > 0
    nan = jnp.asarray(jnp.nan, fitness.dtype)
    largest, smallest = stopping.extremes(fitness, valid)
    return {
        "fitness_mean": jnp.where(any_valid, mean, nan),
        "fitness_std": jnp.where(any_valid, jnp.sqrt(var), nan),
        "fitness_max": jnp.where(any_valid, largest, nan),
        "fitness_min": jnp.where(any_valid, smallest, nan),
        "num_invalid": (fitness.shape[0] - count).astype(jnp.int32),
    }
