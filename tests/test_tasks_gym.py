"""gymnasium tasks: the Task interface, numpy policies, observation statistics, refused spaces."""


import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import es
import tasks
from tasks.gym import GymTask


class MultiDiscreteActions(gymnasium.Env):
    """A one-step environment whose actions a numpy policy cannot produce."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gymnasium.spaces.MultiDiscrete([3, 2])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, True, False, {}


gymnasium.register("EsTest/MultiDiscrete-v0", entry_point=MultiDiscreteActions, max_episode_steps=5)



@pytest.mark.slow
def test_a_gymnasium_task_has_the_task_interface():
    task = tasks.make("gymnasium:CartPole-v1", num_workers=2)
    assert isinstance(task, GymTask) and task.max_steps == 500 and task.num_episodes == 1
    params = task.init_params(jax.random.key(0))
    assert params["out"]["w"].shape == (4, 2) and not np.any(params["out"]["w"])  # linear, ARS's zero start
    assert isinstance(task.fitness, es.HostFitness) and task.fitness.stateful
    assert task.fitness is task.fitness  # one pool per task object
    state = tasks.default_strategy(task).init(jax.random.key(1), params, fitness=task.fitness)
    assert float(state.fitness_state.env_steps) == 0.0 and float(state.fitness_state.obs.count) == 0.0
    held_out = task.held_out(3)
    assert held_out.num_episodes == 3
    value = held_out.mean_return(params, jax.random.key(2), state.fitness_state)
    assert value == held_out.mean_return(params, jax.random.key(2), state.fitness_state)  # seeded by the key
    assert 8 <= value <= 500
    with pytest.raises(ValueError, match="pass the running statistics"):
        task.mean_return(params, jax.random.key(2))


@pytest.mark.slow
def test_evolving_a_gymnasium_task_counts_env_steps_and_folds_in_the_observation_statistics():
    task = tasks.make("gymnasium:CartPole-v1", num_workers=2)
    strategy = tasks.default_strategy(task)
    assert isinstance(strategy, es.ARS)
    state = strategy.init(jax.random.key(0), task.init_params(jax.random.key(0)), fitness=task.fitness)
    with task.fitness:
        state, metrics = es.evolve(strategy, task.fitness, state, 3, mesh=es.make_mesh(2))
    steps = float(state.fitness_state.env_steps)
    assert steps >= 3 * strategy.popsize * 8 and int(metrics["num_invalid"].sum()) == 0
    assert float(state.fitness_state.obs.count) == steps  # every observation a policy acted on
    assert np.all(np.asarray(state.fitness_state.obs.m2) > 0)


def test_the_numpy_policy_computes_what_the_jax_policy_computes():
    task = tasks.make("gymnasium:Pendulum-v1", policy="mlp", hidden_sizes=(8,), action_squash="tanh")
    params = jax.tree.map(lambda x: x + 0.3, task.init_params(jax.random.key(0)))
    for x in np.random.default_rng(0).normal(size=(5, task.obs_size)).astype(np.float32):
        ours = task.act(jax.tree.map(np.asarray, params), x)
        expected = task.policy.apply(params, jnp.asarray(x), jax.random.key(0))
        np.testing.assert_allclose(ours, np.asarray(expected), rtol=1e-5, atol=1e-6)
        assert ours.shape == (1,) and -2.0 <= ours[0] <= 2.0


def test_linear_policies_clip_and_the_survival_bonus_is_subtracted_in_training_only():
    task = tasks.make("gymnasium:Hopper-v5")
    assert task.reward_offset == -1.0 and task.action_squash == "clip" and task.policy.hidden_sizes == ()
    params = {"out": {"w": np.full((11, 3), 10.0, np.float32), "b": np.zeros(3, np.float32)}}
    assert np.all(np.abs(task.act(params, np.ones(11, np.float32))) == 1.0)
    assert tasks.make("gymnasium:HalfCheetah-v5").reward_offset == 0.0
    zeros = jax.tree.map(np.zeros_like, params)
    returns, lengths, _ = task.rollout(zeros, 0, None, task.reward_offset)
    true_returns, _, _ = task.rollout(zeros, 0, None)
    np.testing.assert_allclose(returns, true_returns - lengths)


@pytest.mark.parametrize("shared_by, popsize, spread", [(None, 2, True), ("pair", 2, False), ("pair", 4, True),
                                                        ("generation", 4, False)])
@pytest.mark.slow
def test_common_random_numbers_give_the_members_compared_the_same_episodes(shared_by, popsize, spread):
    task = tasks.make("gymnasium:Pendulum-v1", num_workers=1, common_random_numbers=shared_by)
    assert isinstance(task.fitness, es.HostFitness if shared_by is None else es.CommonRandomNumbers)
    assert task.held_out(3).common_random_numbers is None  # held-out episodes each have their own seed
    strategy = es.ARS(popsize=popsize, sigma=1e-6)  # members' policies all but equal: returns differ by the start
    state = strategy.init(jax.random.key(0), task.init_params(jax.random.key(0)), fitness=task.fitness)
    with task.host_fitness:
        _, metrics = es.evolve(strategy, task.fitness, state, 2)
    stds = np.asarray(metrics["fitness_std"])
    assert np.all(stds > 1.0) if spread else np.all(stds < 1e-2), stds


@pytest.mark.slow
def test_ants_defaults_with_common_random_numbers_give_the_same_params_on_one_and_two_devices():
    task = tasks.make("gymnasium:Ant-v5", num_workers=2, training_steps=10)
    assert task.common_random_numbers == "generation"
    strategy = tasks.default_strategy(task)  # ARS, popsize 120
    runs = []
    with task.host_fitness:
        for devices in (1, 2):
            state = strategy.init(jax.random.key(0), task.init_params(jax.random.key(0)), fitness=task.fitness)
            runs.append(es.evolve(strategy, task.fitness, state, 2, mesh=es.make_mesh(devices))[0])
    one, two = (jax.tree.map(np.asarray, (s.params, s.fitness_state)) for s in runs)
    assert float(one[1].env_steps) == 2 * 120 * 10
    jax.tree.map(np.testing.assert_array_equal, one, two)


def test_training_steps_shorten_training_episodes_only():
    task = tasks.make("gymnasium:Pendulum-v1", num_workers=1, training_steps=50)  # Pendulum never terminates
    strategy = es.ARS(popsize=4)
    state = strategy.init(jax.random.key(0), task.init_params(jax.random.key(0)), fitness=task.fitness)
    with task.host_fitness:
        state, _ = es.evolve(strategy, task.fitness, state, 2)
    assert float(state.fitness_state.env_steps) == 2 * 4 * 50
    params = jax.tree.map(np.asarray, state.params)
    _, lengths, _ = task.held_out(2).rollout(params, 0, state.fitness_state.obs)
    assert list(lengths) == [200, 200]  # held-out episodes run to the env's time limit


def test_ant_trains_on_short_episodes_with_common_random_numbers_by_default_and_other_envs_do_not():
    ant = tasks.make("gymnasium:Ant-v5")
    assert (ant.training_steps, ant.common_random_numbers, ant.reward_offset) == (250, "generation", -1.0)
    assert isinstance(ant.fitness, es.CommonRandomNumbers) and ant.fitness.shared_by == "generation"
    plain = tasks.make("gymnasium:Ant-v5", training_steps=1000, common_random_numbers=False)
    assert (plain.training_steps, plain.common_random_numbers) == (1000, None)
    assert isinstance(plain.fitness, es.HostFitness)
    for env_id in ("Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Pendulum-v1"):
        task = tasks.make(f"gymnasium:{env_id}")
        assert (task.training_steps, task.common_random_numbers) == (None, None), env_id


def test_environments_whose_actions_the_policy_cannot_produce_are_refused():
    with pytest.raises(ValueError, match=r"action space MultiDiscrete\(\[3 2\]\) is not supported"):
        tasks.make("gymnasium:EsTest/MultiDiscrete-v0")


def test_bad_options_are_refused_with_the_option_named():
    with pytest.raises(ValueError, match="policy"):
        tasks.make("gymnasium:CartPole-v1", policy="cnn")
    with pytest.raises(ValueError, match="a linear policy has no hidden layers"):
        tasks.make("gymnasium:CartPole-v1", hidden_sizes=(8,))
    with pytest.raises(ValueError, match="num_workers"):
        tasks.make("gymnasium:CartPole-v1", num_workers=0)
    for hidden_sizes in (32, (0,), (True,)):  # 32 used to fail inside tuple() with a bare TypeError
        with pytest.raises(ValueError, match=r"hidden_sizes=.*give a tuple of positive ints"):
            tasks.make("gymnasium:CartPole-v1", policy="mlp", hidden_sizes=hidden_sizes)
    with pytest.raises(ValueError, match="unknown option"):
        tasks.make("gymnasium:CartPole-v1", episodes=3)
    with pytest.raises(ValueError, match=r"training_steps=0\): training_steps must be an int >= 1"):
        tasks.make("gymnasium:CartPole-v1", training_steps=0)
    with pytest.raises(ValueError, match=r"common_random_numbers='member'\) is unknown; "
                                         r"use one of \['pair', 'generation'\]"):
        tasks.make("gymnasium:CartPole-v1", common_random_numbers="member")
    assert "gymnasium:Hopper-v5" in tasks.names()


def test_mujocos_load_warnings_become_python_warnings_and_leave_no_log_file(tmp_path, monkeypatch, capfd):
    """mujoco 4 warns at every load of gymnasium's own HalfCheetah model (``settotalmass`` is deprecated): printed
    by every worker and appended to ``MUJOCO_LOG.TXT`` in the working directory before. Now dropped; any other
    MuJoCo warning inside ``as_python_warnings`` is a ``RuntimeWarning``, and MuJoCo's handler is put back."""
    import mujoco
    from tasks import gym as gym_tasks
    from tasks import mujoco_warnings

    monkeypatch.chdir(tmp_path)
    with pytest.warns() as caught:
        env = gym_tasks.make_env.__wrapped__("HalfCheetah-v5", 10)  # uncached: the model is loaded here
        env.reset(seed=0)
        model = mujoco.MjModel.from_xml_string("<mujoco><worldbody><body><freejoint/><geom size='.1'/></body>"
                                               "</worldbody></mujoco>")
        data = mujoco.MjData(model)
        data.qvel[:] = np.nan
        with mujoco_warnings.as_python_warnings():
            mujoco.mj_step(model, data)  # MuJoCo's warning of an unstable simulation
    assert [str(w.message).split(" at ")[0] for w in caught] == ["MuJoCo: Nan, Inf or huge value in QVEL"]
    assert caught[0].category is RuntimeWarning and mujoco.get_mju_user_warning() is None
    out, err = capfd.readouterr()
    assert "WARNING" not in out + err and not (tmp_path / "MUJOCO_LOG.TXT").exists()
