"""es.CommonRandomNumbers: members share their evaluation key (per generation or per antithetic pair)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import es
from es.engine import members as population


def key_noise(params, key):
    """A fitness that is pure luck: one normal draw from the member's key (params ignored)."""
    del params
    return jax.random.normal(key)


def run(fitness_fn, generations=3, popsize=16, num_devices=1, antithetic=True, params=None):
    strategy = es.OpenES(popsize=popsize, sigma=0.1, antithetic=antithetic)
    state = strategy.init(jax.random.key(0), jnp.zeros(4) if params is None else params)
    return es.evolve(strategy, fitness_fn, state, generations, mesh=es.make_mesh(num_devices))


def key_data(keys):
    return np.asarray(jax.random.key_data(keys))


def test_eval_keys_are_shared_by_the_generation_or_by_each_antithetic_pair():
    gen_key = population.generation_key(jax.random.key(3), jnp.int32(5))
    members = jnp.arange(8)
    own = key_data(jax.vmap(population.eval_key, in_axes=(None, 0))(gen_key, members))
    assert len({tuple(k) for k in own}) == 8
    generation = key_data(jax.vmap(lambda m: population.eval_key(gen_key, m, "generation"))(members))
    assert (generation == generation[0]).all()
    pair = key_data(jax.vmap(lambda m: population.eval_key(gen_key, m, "pair"))(members))
    assert (pair[0::2] == pair[1::2]).all()
    assert len({tuple(k) for k in pair}) == 4


@pytest.mark.slow
def test_a_generation_sharing_one_key_scores_pure_luck_identically():
    _, alone = run(key_noise)
    _, shared = run(es.CommonRandomNumbers(key_noise))
    assert (np.asarray(alone["fitness_std"]) > 0.5).all()  # 16 independent N(0, 1) draws
    np.testing.assert_array_equal(shared["fitness_max"], shared["fitness_min"])
    assert len(set(np.asarray(shared["fitness_mean"]).tolist())) == 3  # a fresh key every generation


@pytest.mark.slow
def test_a_pair_sharing_one_key_differs_by_its_parameters_only():
    """Fitness ``100 * luck + x_0`` for one pair ``x = +-sigma * eps``: the pair's gap is ``2 sigma |eps_0|``."""

    def lucky_first_coordinate(x, key):
        return 100.0 * jax.random.normal(key) + x[0]

    _, alone = run(lucky_first_coordinate, popsize=2)
    _, shared = run(es.CommonRandomNumbers(lucky_first_coordinate, shared_by="pair"), popsize=2)
    assert (np.asarray(alone["fitness_max"] - alone["fitness_min"]) > 1.0).all()
    assert (np.asarray(shared["fitness_max"] - shared["fitness_min"]) < 2 * 0.1 * 6).all()


@pytest.mark.slow
def test_a_stateful_fitness_and_a_sweep_share_keys_too():
    stateful = es.StatefulFitness(
        init=lambda: jnp.zeros(()),
        evaluate=lambda params, key, count: (key_noise(params, key), jnp.ones(())),
        update=lambda count, ones: count + jnp.sum(ones),
    )
    strategy = es.OpenES(popsize=8, sigma=0.1)
    shared = es.CommonRandomNumbers(stateful)
    states = [strategy.init(jax.random.key(seed), jnp.zeros(3), fitness=shared) for seed in (0, 1)]
    states, metrics = es.evolve_many([strategy, strategy], shared, states, 2, mesh=es.make_mesh(2))
    for state, run_metrics in zip(states, metrics):
        np.testing.assert_array_equal(run_metrics["fitness_max"], run_metrics["fitness_min"])
        assert float(state.fitness_state) == 16.0  # update still sees every member's statistics


def test_the_wrapper_evaluates_its_fitness_when_called():
    key = jax.random.key(7)
    assert float(es.CommonRandomNumbers(key_noise)(jnp.zeros(2), key)) == float(key_noise(None, key))


def test_bad_settings_are_refused_before_compiling():
    with pytest.raises(ValueError, match=r"shared_by='member'.*'pair', 'generation'"):
        run(es.CommonRandomNumbers(key_noise, shared_by="member"))
    with pytest.raises(ValueError, match="antithetic=False; use shared_by='generation'"):
        run(es.CommonRandomNumbers(key_noise, shared_by="pair"), antithetic=False)
    with pytest.raises(TypeError, match="wraps another es.CommonRandomNumbers"):
        run(es.CommonRandomNumbers(es.CommonRandomNumbers(key_noise)))
    with pytest.raises(TypeError, match="must be callable"):
        run(es.CommonRandomNumbers(3.0))


@pytest.mark.slow
def test_a_host_fitness_gets_one_seed_for_the_whole_generation():
    with es.HostFitness(lambda params, seed: float(seed % 1000), num_workers=1) as host:
        _, alone = run(host, generations=1, popsize=4)
        _, shared = run(es.CommonRandomNumbers(host), generations=1, popsize=4)
    assert float(alone["fitness_std"][0]) > 0
    assert float(shared["fitness_max"][0]) == float(shared["fitness_min"][0])


def test_a_task_option_wraps_its_training_fitness_and_held_out_evaluation_drops_it():
    import tasks

    task = tasks.make("CartPole-v1", common_random_numbers="pair")
    assert isinstance(task.fitness, es.CommonRandomNumbers) and task.fitness.shared_by == "pair"
    assert task.held_out(8).common_random_numbers is None
    assert not isinstance(tasks.make("CartPole-v1").fitness, es.CommonRandomNumbers)
    with pytest.raises(ValueError, match=r"common_random_numbers='yes'\) is unknown; use one of \['pair', 'generation'\]"):
        tasks.make("CartPole-v1", common_random_numbers="yes")
    assert isinstance(tasks.make("CartPole-v1", obs_norm=False, common_random_numbers="generation").fitness,
                      es.CommonRandomNumbers)
    counting = tasks.make("CartPole-v1", common_random_numbers="generation").fitness  # the task's one fitness
    assert isinstance(counting, es.CommonRandomNumbers) and isinstance(counting.fitness, es.StatefulFitness)
