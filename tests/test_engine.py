"""The engine's behaviour: continuation, NaN safety, learning (device-count invariance: tests/test_invariance.py)."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import STRATEGIES, nan_for_some_members, rastrigin, sphere

import es


def run(strategy, fitness_fn, params, generations, num_devices, seed=0, **execution):
    state = strategy.init(jax.random.key(seed), params)
    return es.evolve(strategy, fitness_fn, state, generations, mesh=es.make_mesh(num_devices), **execution)


@pytest.mark.slow
def test_two_calls_continue_one_run_bit_for_bit():
    strategy = es.OpenES(popsize=32, sigma=0.1, optimizer=optax.adam(0.05))
    mesh = es.make_mesh(8)
    state = strategy.init(jax.random.key(3), jnp.linspace(-2.0, 2.0, 50))
    whole, whole_metrics = es.evolve(strategy, rastrigin, state, 30, mesh=mesh)
    half, first = es.evolve(strategy, rastrigin, state, 15, mesh=mesh)
    half, second = es.evolve(strategy, rastrigin, half, 15, mesh=mesh)
    chex.assert_trees_all_equal(half, whole)
    chex.assert_trees_all_equal(jax.tree.map(lambda a, b: jnp.concatenate([a, b]), first, second), whole_metrics)
    assert int(whole.generation) == 30


@pytest.mark.slow
def test_evolve_can_be_called_under_jit():
    strategy = es.OpenES(popsize=16, sigma=0.1)
    state = strategy.init(jax.random.key(0), jnp.ones(10))
    mesh = es.make_mesh(4)
    jitted = jax.jit(lambda s: es.evolve(strategy, sphere, s, 4, mesh=mesh))
    chex.assert_trees_all_equal(jitted(state), es.evolve(strategy, sphere, state, 4, mesh=mesh))


def test_metrics_have_one_row_per_generation():
    strategy = es.OpenES(popsize=16, sigma=0.1)
    state, metrics = run(strategy, sphere, jnp.ones(10), 7, num_devices=2)
    assert set(metrics) == set(es.METRIC_NAMES)
    for name, values in metrics.items():
        assert values.shape == (7,), name
    assert np.all(np.asarray(metrics["fitness_max"]) >= np.asarray(metrics["fitness_mean"]))
    assert np.all(np.asarray(metrics["fitness_mean"]) >= np.asarray(metrics["fitness_min"]))
    chex.assert_trees_all_close(metrics["sigma"], jnp.full(7, 0.1))
    assert float(metrics["best_fitness"][-1]) == float(state.best_fitness)
    np.testing.assert_allclose(float(sphere(state.best_params, None)), float(state.best_fitness), rtol=1e-5)


def test_zero_generations_return_the_state_unchanged():
    strategy = es.OpenES(popsize=8, sigma=0.1)
    state = strategy.init(jax.random.key(0), jnp.ones(3))
    new_state, metrics = es.evolve(strategy, sphere, state, 0)
    chex.assert_trees_all_equal(new_state, state)
    assert all(v.shape == (0,) for v in metrics.values())


def test_a_state_returned_on_a_mesh_mixes_with_single_device_values_in_eager_code():
    """evolve's outputs are replicated on the mesh; editing them eagerly (a Python scalar, an array on one device)
    works as on plain arrays (a mesh with JAX's Explicit axes refused ``.at[].set`` with a sharding error)."""
    strategy = es.OpenES(popsize=8, sigma=0.1)
    state, _ = es.evolve(strategy, sphere, strategy.init(jax.random.key(0), jnp.ones(3)), 0, mesh=es.make_mesh(8))
    assert state.params.sharding.mesh.size == 8
    edited = state.params.at[0].set(2.0).at[1].add(jnp.float32(0.5)) * jnp.ones(3)
    np.testing.assert_array_equal(edited, np.array([2.0, 1.5, 1.0], np.float32))


@pytest.mark.parametrize("shaping_method", ["z_score", "raw"])  # centered_rank: tests/test_strategies.py's OpenES
def test_invalid_fitness_is_counted_and_never_corrupts_params(shaping_method):
    strategy = dataclasses.replace(STRATEGIES["OpenES"], fitness_shaping=shaping_method)
    state, metrics = run(strategy, nan_for_some_members, jnp.ones(20), 30, num_devices=8)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(state.params))
    invalid = np.asarray(metrics["num_invalid"])
    assert invalid.sum() > 0 and np.all(invalid < strategy.popsize)
    assert np.all(np.isfinite(np.asarray(metrics["fitness_mean"])))
    assert float(jnp.sum(state.params**2)) < 20.0  # still learns: started at 20


def test_all_invalid_generation_leaves_params_unchanged():
    strategy = es.OpenES(popsize=8, sigma=0.1, optimizer=optax.sgd(0.1))
    state = strategy.init(jax.random.key(0), jnp.ones(5))
    new_state, metrics = es.evolve(strategy, lambda x, k: jnp.nan, state, 3)
    chex.assert_trees_all_equal(new_state.params, state.params)
    assert np.asarray(metrics["num_invalid"]).tolist() == [8, 8, 8]
    assert np.all(np.isnan(np.asarray(metrics["fitness_mean"])))


def test_minimize_descends():
    strategy = es.OpenES(popsize=32, sigma=0.05, optimizer=optax.adam(0.05), maximize=False)
    state = strategy.init(jax.random.key(0), jnp.ones(10))
    state, metrics = es.evolve(strategy, lambda x, k: jnp.sum(x**2), state, 100)
    assert float(jnp.sum(state.params**2)) < 0.05 * 10
    assert float(metrics["best_fitness"][-1]) <= float(metrics["fitness_min"][0])


@pytest.mark.slow
def test_optimises_100d_sphere_by_100x_in_150_generations():
    """On 8 devices (the same bits as on 1: tests/test_invariance.py)."""
    strategy = es.OpenES(popsize=128, sigma=0.05, optimizer=optax.adam(0.05))
    start = jnp.ones(100)
    state, _ = run(strategy, sphere, start, 150, 8)
    assert -float(sphere(state.params, None)) < -float(sphere(start, None)) / 100


@pytest.mark.slow
def test_optimises_100d_rastrigin_by_2x_in_300_generations():
    strategy = es.OpenES(
        popsize=256, sigma=optax.linear_schedule(1.0, 0.1, 300), optimizer=optax.adam(optax.linear_schedule(0.1, 0.01, 300))
    )
    start = jax.random.uniform(jax.random.key(7), (100,), minval=-5.12, maxval=5.12)
    state, metrics = run(strategy, rastrigin, start, 300, 1)
    assert -float(rastrigin(state.params, None)) < -float(rastrigin(start, None)) / 2
    assert float(metrics["sigma"][-1]) < float(metrics["sigma"][0])


def test_bound_method_of_unhashable_object_is_a_fitness_fn():
    class Task:  # defines __eq__ without __hash__, like a non-frozen dataclass
        def __init__(self, scale):
            self.scale = scale

        def __eq__(self, other):
            return isinstance(other, Task) and other.scale == self.scale

        __hash__ = None

        def fitness(self, x, key):
            return -self.scale * jnp.sum(x**2)

    task = Task(2.0)
    strategy = es.OpenES(popsize=8, sigma=0.1)
    state, _ = run(strategy, task.fitness, jnp.ones(4), 20, num_devices=2)
    assert float(jnp.sum(state.params**2)) < 4.0


def test_pytree_params_keep_their_structure_and_dtypes():
    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2, jnp.bfloat16), "layers": [jnp.ones(1, jnp.float16)]}
    strategy = es.OpenES(popsize=8, sigma=0.1, weight_decay=0.01)
    state, _ = run(strategy, sphere, params, 3, num_devices=2)
    chex.assert_trees_all_equal_shapes_and_dtypes(state.params, params)
    chex.assert_trees_all_equal_shapes_and_dtypes(state.best_params, params)


def test_antithetic_pairs_mirror_each_other():
    """Members 2j and 2j+1 are theta + sigma * eps and theta - sigma * eps."""
    seen = []
    strategy = es.OpenES(popsize=8, sigma=0.5)

    def record(x, key):
        return x[0]  # the fitness is the first coordinate: theta_0 + sign * sigma * eps_0

    state = strategy.init(jax.random.key(0), jnp.zeros(3))
    hlo_free_state, metrics = es.evolve(strategy, record, state, 1)
    del hlo_free_state
    # centered mean of antithetic pairs around theta = 0 is exactly zero
    seen.append(float(metrics["fitness_mean"][0]))
    assert abs(seen[0]) < 1e-6
    assert float(metrics["fitness_max"][0]) == -float(metrics["fitness_min"][0])


def test_sigma_schedule_and_weight_decay():
    schedule = optax.exponential_decay(0.2, transition_steps=5, decay_rate=0.5)
    strategy = es.OpenES(popsize=16, sigma=schedule, weight_decay=0.1, optimizer=optax.sgd(0.1))
    state = strategy.init(jax.random.key(0), jnp.full(4, 3.0))
    _, metrics = es.evolve(strategy, lambda x, k: jnp.zeros(()), state, 10)
    np.testing.assert_allclose(np.asarray(metrics["sigma"]), [float(schedule(i)) for i in range(10)], rtol=1e-6)
    # constant fitness: the gradient estimate is zero and only weight decay moves params
    decayed, _ = es.evolve(strategy, lambda x, k: jnp.zeros(()), state, 10)
    np.testing.assert_allclose(np.asarray(decayed.params), 3.0 * (1 - 0.1 * 0.1) ** 10, rtol=1e-5)


def test_make_mesh_for_a_popsize_takes_the_most_devices_that_divide_it():
    assert es.make_mesh(popsize=12).size == 6  # 8 devices; 12 splits over 1, 2, 3, 4 or 6
    assert es.make_mesh(popsize=64).size == 8
    assert es.make_mesh(4, popsize=12).size == 4
    with pytest.raises(ValueError, match=r"make_mesh\(num_devices=8, popsize=12\).*not divisible"):
        es.make_mesh(8, popsize=12)


def test_init_from_seed_splits_the_seed_into_the_params_key_and_the_run_key():
    strategy = es.SNES(popsize=8)
    state = es.init_from_seed(strategy, 3, lambda key: jax.random.normal(key, (4,)))
    init_key, run_key = jax.random.split(jax.random.key(3))
    chex.assert_trees_all_equal(state, strategy.init(run_key, jax.random.normal(init_key, (4,))))
    with pytest.raises(ValueError, match=r"init_from_seed\(seed=-1\)"):
        es.init_from_seed(strategy, -1, lambda key: jnp.zeros(4))
