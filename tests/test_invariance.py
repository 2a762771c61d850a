"""Device-count invariance, in one place: every strategy, noise source, exchange mode and fitness kind gives the
same bits on 8 devices as on 1; one case runs the whole 1/2/4/8 sweep.

Each case is compared once: 3 generations (``GENERATIONS``) of a population of 32 (``POPSIZE``) on a
fitness that uses its key (``noisy_policy_return``), unless the case needs something else (low-rank noise
needs matrix leaves and ``es.matmul``, the sharded update needs more coordinates than one device's slice,
a gymnax task is its own fitness, CMA-ES's covariance wants fewer params). The gradient exchange, whose all-reduce rounds by device, is only close
across device counts: tests/test_exchange.py.
"""

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import pytest
from helpers import GENERATIONS, POPSIZE, STRATEGIES, evolve, noisy_policy_return, policy_params
from test_host import evolve_with, host_problem
from test_lowrank import LOW_RANK_STRATEGIES, mlp_fitness, mlp_params
from test_sharded import COORDINATEWISE, SOURCES, noisy_fitness, odd_sized_params
from test_sharded import evolve as evolve_sharded

import es
import tasks
from es.engine import execution

pytestmark = pytest.mark.slow  # make test-fast leaves it out: every strategy, noise, exchange and fitness kind on 1 and 8 devices

TABLE = es.NoiseTable(size=2**20, seed=2)


@functools.cache
def one_device(case: str):
    """The 1-device run of ``case`` (computed, and compiled, once per module)."""
    strategy, fitness_fn, params, options = CASES[case]()
    return evolve(strategy, fitness_fn, params, GENERATIONS, 1, **options)


def static_config_fitness(params, key, horizon, use_bonus, shape):
    """Python values closed over (a shape, a loop count, a flag) must stay static on any mesh; uses its key."""
    x = params["w1"].reshape(shape)
    total = 0.01 * jax.random.normal(key)
    for _ in range(horizon):
        total = total - jnp.sum(x**2)
    return total + (1.0 if use_bonus else 0.0)


def counting_fitness():
    """An ``es.StatefulFitness``: the policy return, and a population-wide count of evaluations."""
    return es.StatefulFitness(init=lambda: jnp.zeros(()),
                              evaluate=lambda params, key, count: (noisy_policy_return(params, key), jnp.ones(())),
                              update=lambda count, ones: count + jnp.sum(ones))


def weighted_noisy_sphere(x, key):
    """For CMAES, whose covariance grows with the square of the params: 20 of them, a fitness that uses its key."""
    return -jnp.sum((x - 0.3) ** 2 * jnp.arange(1.0, 21.0)) + 0.01 * jax.random.normal(key)


def rollout(strategy, fitness_fn=noisy_policy_return, **options):
    return lambda: (strategy, fitness_fn, policy_params(), options)


CASES = {
    # every strategy, PRNG noise, exchange="fitness", a JAX fitness that uses its key
    **{name: rollout(strategy) for name, strategy in STRATEGIES.items()},
    "CMAES": lambda: (es.CMAES(popsize=POPSIZE, sigma=0.5), weighted_noisy_sphere, jnp.linspace(-1.0, 1.0, 20), {}),
    # the noise table, for a strategy that sums the noise alone (without antithetic pairs, with micro-batches
    # smaller than a device's share) and one that also sums its squares (with pairs)
    "OpenES-table-batched": rollout(es.OpenES(popsize=POPSIZE, sigma=0.1, antithetic=False, fitness_shaping="z_score",
                                              noise=TABLE), eval_batch_size=2, update_batch_size=5),
    "SNES-antithetic-table": rollout(dataclasses.replace(STRATEGIES["SNES-antithetic"], noise=TABLE)),
    # low-rank noise: every strategy that takes it, factored; materialised with one
    **{f"{name}-lowrank-factored": (lambda name=name: (
        LOW_RANK_STRATEGIES[name](es.LowRankNoise(rank=2, factored=True)), mlp_fitness, mlp_params(), {}))
       for name in LOW_RANK_STRATEGIES},
    "OpenES-lowrank-materialised": lambda: (
        LOW_RANK_STRATEGIES["OpenES"](es.LowRankNoise(rank=2)), mlp_fitness, mlp_params(), {}),
    # fitness kinds: common random numbers (a generation; a pair, of a fitness whose Python config stays static),
    # a stateful fitness
    "OpenES-crn-generation": rollout(STRATEGIES["OpenES"], es.CommonRandomNumbers(noisy_policy_return)),
    "OpenES-crn-pair-static-config": rollout(STRATEGIES["OpenES"], es.CommonRandomNumbers(functools.partial(
        static_config_fitness, horizon=3, use_bonus=True, shape=(8, 16)), "pair")),
    "OpenES-stateful": lambda: (STRATEGIES["OpenES"], counting_fitness(), policy_params(), {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_8_devices_give_the_bits_of_1(case):
    strategy, fitness_fn, params, options = CASES[case]()
    chex.assert_trees_all_equal(evolve(strategy, fitness_fn, params, GENERATIONS, 8, **options), one_device(case))


def test_2_and_4_devices_give_the_bits_of_1_too():
    """The whole sweep once: OpenES with Adam on the policy rollout (the other cases: 1 against 8)."""
    strategy, fitness_fn, params, _ = CASES["OpenES"]()
    for num_devices in (2, 4):
        chex.assert_trees_all_equal(evolve(strategy, fitness_fn, params, GENERATIONS, num_devices),
                                    one_device("OpenES"))


def test_an_environment_task_with_observation_statistics_gives_the_same_bits_on_8_devices():
    task = tasks.make("CartPole-v1", hidden_sizes=(16,), num_episodes=2)
    assert isinstance(task.fitness, es.StatefulFitness)
    strategy = STRATEGIES["OpenES"]
    state = strategy.init(jax.random.key(0), task.init_params(jax.random.key(1)), fitness=task.fitness)
    one, eight = (es.evolve(strategy, task.fitness, state, GENERATIONS, mesh=es.make_mesh(n)) for n in (1, 8))
    chex.assert_trees_all_equal(one, eight)
    assert float(eight[0].fitness_state.obs.count) == float(eight[0].fitness_state.env_steps) > 0


@pytest.mark.parametrize("shared_by, layouts", [(None, ((1, 1), (2, 2), (2, 8))), ("generation", ((1, 1), (2, 8)))],
                         ids=["own-seeds", "crn-generation"])
def test_a_host_fitness_gives_the_same_bits_on_any_device_count_and_number_of_workers(shared_by, layouts):
    """(workers, devices) layouts; with ``es.CommonRandomNumbers`` too (one seed for the whole generation)."""
    runs = {(workers, devices): evolve_with(host_problem, devices=devices, shared_by=shared_by, num_workers=workers)
            for workers, devices in layouts}
    (reference, metrics), *others = runs.values()
    assert int(metrics["num_invalid"].sum()) == 0
    for state, _ in others:
        chex.assert_trees_all_equal(state.params, reference.params)
        assert float(state.best_fitness) == float(reference.best_fitness)


# exchange="sharded": each device rebuilds a slice of every member's noise (and, for a coordinatewise strategy,
# updates only its slice, keeps its slice of the private state and gathers the new mean): the bits of
# exchange="fitness" on one device (tests/test_sharded.py has the problem, 70,001 params whose last slice on 8
# devices overlaps the one before it). Every strategy with PRNG noise, whole updates (OpenES with optax's Adam,
# PGPE with ClipUp, SepCMAES) and coordinatewise ones (SNES, ARS, OpenES with es's Adam, PGPE with momentum) on
# 8 devices; the table with a strategy that gathers the linear sum alone (OpenES), one that also gathers the
# squared sum (SNES), and a private optimizer state beside a shared sigma (OpenES-coordinatewise, SNES); each
# other device count once.
SHARDED_STRATEGIES = {**{name: STRATEGIES[name] for name in ("OpenES", "SNES", "PGPE", "ARS", "SepCMAES")},
                      "OpenES-coordinatewise": COORDINATEWISE["OpenES"], "PGPE-coordinatewise": COORDINATEWISE["PGPE"]}
SHARDED_CASES = [(name, "prng", 8) for name in SHARDED_STRATEGIES] + [
    (name, "table", 8) for name in ("OpenES", "SNES", "OpenES-coordinatewise")] + [
    ("OpenES", "prng", 1), ("OpenES", "prng", 2), ("SNES", "prng", 4), ("OpenES-coordinatewise", "prng", 2),
    ("PGPE-coordinatewise", "prng", 4)]


def sharded_strategy(name, source):
    return dataclasses.replace(SHARDED_STRATEGIES[name], noise=SOURCES[source])


@functools.cache
def fitness_reference(name, source):
    """``exchange="fitness"`` on one device for the odd-sized params: computed (and compiled) once per module."""
    return evolve_sharded(sharded_strategy(name, source), odd_sized_params(), 1, "fitness")


@pytest.mark.parametrize("name, source, num_devices", SHARDED_CASES, ids=[f"{n}-{s}-{d}" for n, s, d in SHARDED_CASES])
def test_sharded_exchange_gives_the_bits_of_fitness_exchange_on_one_device(name, source, num_devices):
    strategy = sharded_strategy(name, source)
    assert strategy.coordinatewise == (name in ("SNES", "ARS") or name.endswith("-coordinatewise"))
    state = strategy.init(jax.random.key(0), odd_sized_params())
    _, resolved = execution.check_evolve_args(strategy, es.fitness.adapter(noisy_fitness), state, 1,
                                              es.make_mesh(num_devices), "sharded")
    assert resolved.shard_update == (strategy.coordinatewise and num_devices > 1)
    chex.assert_trees_all_equal(evolve_sharded(strategy, odd_sized_params(), num_devices, "sharded"),
                                fitness_reference(name, source))
