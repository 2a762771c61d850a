"""gymnax tasks: every env id builds, rollouts are masked after the first done, policies and heads,
observation normalisation, and ES on CartPole and Pendulum (identical on 1 and 8 devices)."""

import dataclasses

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import programs_built

import es
import tasks
from tasks import envs, obs_norm
from tasks.policies import BoxHead, DiscreteHead, GaussianHead

pytestmark = pytest.mark.slow  # make test-fast leaves it out: rollouts of every gymnax env kind


# One compiled rollout per (hashable, static) task config, shared by the tests below.
rollout = jax.jit(tasks.EnvTask.rollout, static_argnums=0)
CARTPOLE = tasks.make("CartPole-v1", hidden_sizes=(), obs_norm=False, num_episodes=8)


def constant_action(action):
    """Linear-policy params whose argmax is always ``action``."""
    return {"out": {"w": jnp.zeros((4, 2)), "b": jnp.zeros(2).at[action].set(1.0)}}


def linear_cartpole(push_right_if):
    """Params of a linear (hidden_sizes=()) CartPole policy whose logit difference is ``obs @ push_right_if``."""
    w = jnp.zeros((4, 2)).at[:, 1].set(jnp.asarray(push_right_if, jnp.float32))
    return {"out": {"w": w, "b": jnp.zeros(2)}}


def python_loop_return(env, env_params, key, policy, max_steps):
    """Reference rollout: plain Python over gymnax's reset/step with the key scheme EnvTask documents."""
    reset_key, run_key = jax.random.split(key)
    obs, state = env.reset(reset_key, env_params)
    total = 0.0
    for t in range(max_steps):
        _, step_key = jax.random.split(jax.random.fold_in(run_key, t))
        obs, state, reward, terminated, truncated, _ = env.step(step_key, state, policy(obs), env_params)
        total += float(reward)
        if bool(terminated) or bool(truncated):
            return total, t + 1
    return total, max_steps


# ----------------------------------------------------------------- every env id


def _fake_mnist(directory="/tmp/mnist"):
    """MNISTBandit-bsuite downloads MNIST when built; this stands in for it offline."""
    images = np.zeros((20, 28, 28), np.int8)
    labels = np.arange(20, dtype=np.uint8) % 10
    return (images, labels), (images, labels)


def test_every_registered_gymnax_env_id_is_a_task_with_a_scalar_fitness(monkeypatch):
    monkeypatch.setattr("gymnax.utils.load_mnist.load_mnist", _fake_mnist)
    envs.make_env.cache_clear()
    try:
        for env_id in gymnax.registered_envs:
            assert env_id in tasks.names()
            task = tasks.make(env_id, max_steps=5)
            params = jax.eval_shape(task.init_params, jax.random.key(0))  # shapes only: tracing, no compiling
            fitness = task.fitness
            state = fitness.init() if isinstance(fitness, es.StatefulFitness) else None
            out = jax.eval_shape(lambda p, k: task.mean_return(p, k, state), params, jax.random.key(1))
            assert out.shape == () and out.dtype == jnp.float32, env_id
            # Normalised by default exactly when observations are arrays (vectors or images, not one-hot).
            assert task.obs_norm == (task.obs_categories == 0), env_id
    finally:
        envs.make_env.cache_clear()


def test_an_eager_held_out_evaluation_is_one_program_with_the_bits_of_a_jitted_one():
    task = tasks.make("CartPole-v1", hidden_sizes=(16,), num_episodes=2)
    params, key, state = task.init_params(jax.random.key(1)), jax.random.key(2), task.init_fitness_state()
    held_out = task.held_out(3)
    with programs_built() as built:
        value = held_out.mean_return(params, key, state)
    assert built == ["jit(_mean_return)"]
    assert np.asarray(value).tobytes() == np.asarray(jax.jit(held_out.mean_return)(params, key, state)).tobytes()


def test_env_ids_registered_after_import_are_accepted():
    env_id = "CartPoleCopyForTasksTest-v0"
    if env_id not in gymnax.registered_envs:
        gymnax.register(env_id, lambda: gymnax.make("CartPole-v1")[0])
    assert env_id in tasks.names()
    assert tasks.make(env_id, obs_norm=False).max_steps == 500


def test_rollouts_run_for_image_discrete_and_box_spaces():
    checks = {
        "Breakout-MinAtar": dict(policy="cnn"),  # [10, 10, 4] images, conv policy
        "Catch-bsuite": dict(policy="cnn"),  # [10, 5] images: one channel
        "FrozenLake-misc": dict(),  # Discrete observations: one-hot features
        "Reacher-misc": dict(),  # Box actions with per-element bounds
    }
    for env_id, options in checks.items():
        task = tasks.make(env_id, num_episodes=2, max_steps=20, **options)
        out = jax.jit(task.rollout)(task.init_params(jax.random.key(0)), jax.random.key(1))
        assert out.returns.shape == (2,) and np.all(np.isfinite(out.returns)), env_id
        assert np.all((out.lengths >= 1) & (out.lengths <= 20)), env_id
    lake = tasks.make("FrozenLake-misc")
    assert lake.obs_categories == 16 and lake.policy.obs_size == 16
    np.testing.assert_array_equal(lake.features(jnp.int32(3)), np.eye(16)[3])


# ------------------------------------------------------------ returns and masking


def test_fixed_policy_return_on_cartpole_matches_a_python_loop_and_the_physics():
    """Always pushing right tips the pole left: with |state| <= 0.05 at reset, theta'' ~ -14.6 rad/s^2
    reaches the 0.21 rad limit after ~0.17 s, i.e. 7 to 12 steps of 0.02 s (one reward per step)."""
    key = jax.random.key(0)
    out = rollout(CARTPOLE, constant_action(1), key)
    for i, episode_key in enumerate(jax.random.split(key, CARTPOLE.num_episodes)):
        expected, steps = python_loop_return(CARTPOLE.env, CARTPOLE.gymnax_params, episode_key, lambda obs: 1, 500)
        assert float(out.returns[i]) == expected == float(out.lengths[i]) == steps
        assert 7 <= steps <= 12
    assert float(CARTPOLE.fitness(constant_action(1), key)) == pytest.approx(float(np.mean(out.returns)))


def test_no_reward_is_counted_after_termination_although_gymnax_resets_inside_step():
    """Unmasked, the auto-reset episodes after the pole falls would add ~1 reward per step up to 500."""
    out = rollout(CARTPOLE, constant_action(0), jax.random.key(1))  # always push left
    np.testing.assert_array_equal(out.returns, out.lengths.astype(np.float32))
    assert np.all((out.lengths >= 7) & (out.lengths <= 12))

    # The same episodes stepped by a scan that never stops: summing rewards up to the first done
    # reproduces the masked return, summing everything does not.
    env, env_params = CARTPOLE.env, CARTPOLE.gymnax_params

    def unmasked(key):
        reset_key, run_key = jax.random.split(key)
        _, state = env.reset(reset_key, env_params)

        def step(state, t):
            _, step_key = jax.random.split(jax.random.fold_in(run_key, t))
            _, state, reward, terminated, truncated, _ = env.step(step_key, state, 0, env_params)
            return state, (reward, jnp.logical_or(terminated, truncated))

        _, (rewards, dones) = jax.lax.scan(step, state, jnp.arange(500))
        before_first_done = jnp.cumsum(dones) - dones == 0
        return jnp.sum(rewards * before_first_done), jnp.sum(rewards)

    masked, everything = jax.jit(jax.vmap(unmasked))(jax.random.split(jax.random.key(1), 8))
    np.testing.assert_array_equal(out.returns, masked)
    assert np.all(everything > 400)


def test_truncation_ends_the_episode_even_when_the_loop_allows_more_steps():
    """A linear controller pushing towards the falling side balances the pole; the env truncates at 30."""
    task = tasks.make("CartPole-v1", hidden_sizes=(), obs_norm=False, num_episodes=8, max_steps=100,
                      env_params={"max_steps_in_episode": 30})
    params = linear_cartpole([0.0, 0.0, 1.0, 1.0])
    out = rollout(task, params, jax.random.key(2))
    np.testing.assert_array_equal(out.returns, np.full(8, 30.0))
    np.testing.assert_array_equal(out.lengths, np.full(8, 30))
    # Without the override the same controller keeps going well past 30 steps (to CARTPOLE's 500).
    assert np.all(rollout(CARTPOLE, params, jax.random.key(2)).lengths > 100)


def test_heads_map_outputs_to_valid_actions():
    box = BoxHead((2,), (-2.0, 0.0), (2.0, 1.0))
    huge = box.act(jnp.array([1e6, -1e6]), None)
    np.testing.assert_allclose(huge, [2.0, 0.0])
    np.testing.assert_allclose(box.act(jnp.zeros(2), None), [0.0, 0.5])
    assert int(DiscreteHead(3).act(jnp.array([0.1, 2.0, -1.0]), None)) == 1
    sampled = jax.vmap(DiscreteHead(3, "categorical").act, in_axes=(None, 0))(
        jnp.log(jnp.array([0.2, 0.5, 0.3])), jax.random.split(jax.random.key(0), 4000)
    )
    np.testing.assert_allclose(np.bincount(np.asarray(sampled), minlength=3) / 4000, [0.2, 0.5, 0.3], atol=0.03)
    pendulum = tasks.make("Pendulum-v1")
    assert pendulum.policy.head == BoxHead((1,), (-2.0,), (2.0,))


# ------------------------------------------------------------------ options


def test_options_are_static_hashable_and_validated():
    a = tasks.make("Acrobot-v1", hidden_sizes=[16], env_params={"available_torque": [-2.0, 0.0, 2.0]})
    b = tasks.make("Acrobot-v1", hidden_sizes=(16,), env_params={"available_torque": (-2.0, 0.0, 2.0)})
    assert a == b and hash(a) == hash(b)
    np.testing.assert_array_equal(a.gymnax_params.available_torque, [-2.0, 0.0, 2.0])
    assert a.policy.hidden_sizes == (16,) and a.max_steps == 500
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['episodes'\] .*did you mean \['num_episodes'\]\?"):
        tasks.make("CartPole-v1", episodes=4)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['gravity_x'\].*'gravity'"):
        tasks.make("CartPole-v1", env_params={"gravity_x": 1.0})
    with pytest.raises(ValueError, match="the CNN needs image observations"):
        tasks.make("CartPole-v1", policy="cnn")
    with pytest.raises(ValueError, match="use one of"):
        tasks.make("CartPole-v1", activation="softplus")
    for hidden_sizes in ((0,), (True,), "32", 5.0):
        with pytest.raises(ValueError, match=r"hidden_sizes=.*give a tuple of positive ints"):
            tasks.make("CartPole-v1", hidden_sizes=hidden_sizes)
    with pytest.raises(ValueError, match=r"tasks\.make\('CartPole-v1', num_episodes=0\): num_episodes must be at least 1"):
        tasks.make("CartPole-v1", num_episodes=0)
    with pytest.raises(TypeError, match=r"tasks\.make\('CartPole-v1', num_episodes=2\.0\): num_episodes must be an int"):
        tasks.make("CartPole-v1", num_episodes=2.0)
    with pytest.raises(ValueError, match=r"max_steps=0\): max_steps must be an int >= 1, or None"):
        tasks.make("CartPole-v1", max_steps=0)
    with pytest.raises(TypeError, match=r"obs_norm='yes'\): obs_norm must be True, False or None"):
        tasks.make("CartPole-v1", obs_norm="yes")
    with pytest.raises(ValueError, match=r"output_scale=0\): output_scale must be a finite float > 0"):
        tasks.make("CartPole-v1", output_scale=0)
    with pytest.raises(ValueError, match="unknown task 'CartPole-v2'; did you mean 'CartPole-v1'"):
        tasks.make("CartPole-v2")
    with pytest.raises(ValueError, match="pass the running statistics"):
        tasks.make("CartPole-v1", obs_norm=True).mean_return(a.init_params(jax.random.key(0)), jax.random.key(0))


def test_random_start_actions_vary_breakouts_two_starts_in_training_and_held_out_evaluates_without():
    standard = tasks.make("Breakout-MinAtar", num_episodes=256, action_selection="argmax", obs_norm=False)
    varied = tasks.make("Breakout-MinAtar", num_episodes=256, action_selection="argmax", obs_norm=False,
                        random_start_actions=30)
    params = jax.tree.map(jnp.zeros_like, standard.init_params(jax.random.key(0)))  # argmax of 0s: always no-op
    lengths = {name: set(np.asarray(jax.jit(task.rollout)(params, jax.random.key(1)).lengths).tolist())
               for name, task in [("standard", standard), ("varied", varied)]}
    # The no-op policy loses the ball after 6 or 16 steps from Breakout's two starts; moved first, it returns some.
    assert lengths["standard"] == {6, 16} and len(lengths["varied"]) > 2 and max(lengths["varied"]) > 16
    assert varied.held_out(16) == dataclasses.replace(standard, num_episodes=16)
    assert tasks.make("Breakout-MinAtar", random_start_actions=0) == tasks.make("Breakout-MinAtar")
    with pytest.raises(ValueError, match=r"random_start_actions=-1\): random_start_actions must be at least 0"):
        tasks.make("Breakout-MinAtar", random_start_actions=-1)
    for bad in (1.5, True):
        with pytest.raises(TypeError, match=r"random_start_actions=.*\): random_start_actions must be an int >= 0"):
            tasks.make("Breakout-MinAtar", random_start_actions=bad)


@pytest.mark.parametrize("option", ["activation", "policy", "action_selection"])
def test_unhashable_choice_options_raise_a_clear_error_naming_the_option(option):
    with pytest.raises(ValueError, match=rf"tasks\.make\('CartPole-v1', {option}=\['relu'\]\) is unknown; use one of \["):
        tasks.make("CartPole-v1", **{option: ["relu"]})


def test_env_params_of_the_wrong_number_kind_name_the_env_field_and_type():
    with pytest.raises(ValueError, match=r"'max_steps_in_episode' of CartPole-v1 must be an int.*float 2.5"):
        tasks.make("CartPole-v1", env_params={"max_steps_in_episode": 2.5})
    with pytest.raises(ValueError, match=r"'max_steps_in_episode' of CartPole-v1 must be an int.*bool True"):
        tasks.make("CartPole-v1", env_params={"max_steps_in_episode": True})
    with pytest.raises(ValueError, match=r"'gravity' of CartPole-v1 must be a real number.*str 'x'"):
        tasks.make("CartPole-v1", env_params={"gravity": "x"})
    task = tasks.make("CartPole-v1", env_params={"gravity": 10, "max_steps_in_episode": np.int64(50)})
    assert task.gymnax_params.gravity == 10.0 and task.max_steps == 50


# ------------------------------------------------------- observation normalisation


def test_running_statistics_match_numpy_over_several_generations():
    """Welford per member, then a fixed-order merge per generation, equals one pass over everything."""
    rng = np.random.default_rng(0)
    batches = [rng.normal([3.0, -100.0], [0.5, 2.0], size=(5, 7, 2)).astype(np.float32) for _ in range(3)]
    weights = (rng.uniform(size=(3, 5, 7)) < 0.8).astype(np.float32)  # some steps come after a done
    stats = obs_norm.init(2)
    for batch, weight in zip(batches, weights):  # [members, steps, features]
        def member(xs, ws):
            return jax.lax.fori_loop(0, 7, lambda i, s: obs_norm.add(s, xs[i], ws[i]), obs_norm.init(2))

        stats = obs_norm.merge(stats, jax.vmap(member)(jnp.asarray(batch), jnp.asarray(weight)))
    seen = np.concatenate([b[w > 0] for b, w in zip(batches, weights)]).astype(np.float64)
    assert float(stats.count) == seen.shape[0]
    np.testing.assert_allclose(stats.mean, seen.mean(0), rtol=1e-5)
    np.testing.assert_allclose(obs_norm.std(stats), seen.std(0), rtol=1e-5)
    normalised = obs_norm.normalize(stats, jnp.asarray(seen[0], jnp.float32))
    np.testing.assert_allclose(normalised, (seen[0] - seen.mean(0)) / seen.std(0), rtol=1e-4)


def test_statistics_ignore_observations_after_the_episode_ended():
    task = dataclasses.replace(CARTPOLE, obs_norm=True)
    state = task.init_fitness_state()
    fitness, member = jax.jit(task.evaluate)(constant_action(1), jax.random.key(0), state)
    out = rollout(CARTPOLE, constant_action(1), jax.random.key(0))
    assert float(member.env_steps) == float(out.lengths.sum()) == float(member.obs_stats.count) < 100
    assert float(fitness) == pytest.approx(float(out.returns.mean()))
    # The StatefulFitness is also a plain fitness(params, key), under the initial (identity) statistics.
    assert isinstance(task.fitness, es.StatefulFitness)
    assert float(task.fitness(constant_action(1), jax.random.key(0))) == pytest.approx(float(fitness))


# ------------------------------------------------------------------ ES runs


@pytest.fixture(scope="module")
def cartpole_runs():
    """A short ES run on CartPole with observation normalisation (on 8 devices too: tests/test_invariance.py)."""
    task = tasks.make("CartPole-v1", hidden_sizes=(16,), num_episodes=2)
    assert isinstance(task.fitness, es.StatefulFitness)
    strategy = es.OpenES(popsize=64, sigma=0.1, optimizer=optax.adam(0.05))
    state = strategy.init(jax.random.key(0), task.init_params(jax.random.key(1)), fitness=task.fitness)
    runs = {1: es.evolve(strategy, task.fitness, state, 12, mesh=es.make_mesh(1))}
    return task, strategy, state, runs


def test_short_es_run_improves_cartpole(cartpole_runs):
    task, _, start, runs = cartpole_runs
    final, metrics = runs[1]
    evaluate = jax.jit(task.held_out(16).mean_return)
    before = float(evaluate(start.params, jax.random.key(7), start.fitness_state))
    after = float(evaluate(final.params, jax.random.key(7), final.fitness_state))
    # (The first generations drop below the initial policy while the running statistics move
    # from the identity to the observations' scale.)
    assert after > 2 * before + 50, (before, after)
    assert metrics["fitness_mean"][-1] > metrics["fitness_mean"][0]


def test_short_es_run_improves_pendulum():
    task = tasks.make("Pendulum-v1", num_episodes=2)
    strategy = tasks.default_strategy(task)
    state = strategy.init(jax.random.key(0), task.init_params(jax.random.key(1)), fitness=task.fitness)
    final, metrics = es.evolve(strategy, task.fitness, state, 40)
    evaluate = jax.jit(task.held_out(32).mean_return)
    before = float(evaluate(state.params, jax.random.key(7), state.fitness_state))
    after = float(evaluate(final.params, jax.random.key(7), final.fitness_state))
    assert after > before + 200, (before, after)
    assert np.mean(metrics["fitness_mean"][-5:]) > np.mean(metrics["fitness_mean"][:5])


def test_observation_statistics_are_the_one_small_extra_exchange(cartpole_runs):
    task, strategy, state, _ = cartpole_runs
    report = es.collectives_report(strategy, task.fitness, state, es.make_mesh(8))
    popsize, obs_size = strategy.popsize, task.obs_size
    # Gathered per member: its fitness, env steps and observation count (f32[popsize] each), and the
    # mean and M2 of its observations (f32[popsize, obs_size] each); nothing params-sized.
    results = sorted(c.result.split("{")[0] for c in report.crossing)
    assert results == sorted([f"f32[{popsize}]"] * 3 + [f"f32[{popsize},{obs_size}]"] * 2)
    assert {c.op for c in report.crossing} == {"all-gather"}
    assert report.total_bytes == 4 * popsize * (3 + 2 * obs_size)


# ------------------------------------------------------------- sampled heads


BREAKOUT = tasks.make("Breakout-MinAtar", hidden_sizes=(), num_episodes=4, max_steps=50)
PENDULUM_GAUSSIAN = tasks.make("Pendulum-v1", action_selection="gaussian", hidden_sizes=(8,), obs_norm=False,
                               num_episodes=4, max_steps=20)


def test_minatar_images_default_to_categorical_actions_and_vectors_to_argmax_or_tanh():
    assert BREAKOUT.policy.head == DiscreteHead(3, "categorical")
    assert tasks.make("Breakout-MinAtar", action_selection="argmax").policy.head == DiscreteHead(3, "argmax")
    assert tasks.make("CartPole-v1").policy.head == DiscreteHead(2, "argmax")
    assert tasks.make("Pendulum-v1").policy.head == BoxHead((1,), (-2.0,), (2.0,))


def test_gaussian_head_has_mean_and_log_scale_outputs_and_stays_in_the_box():
    head = PENDULUM_GAUSSIAN.policy.head
    assert head == GaussianHead((1,), (-2.0,), (2.0,)) and head.size == 2
    params = PENDULUM_GAUSSIAN.init_params(jax.random.key(0))
    assert params["out"]["w"].shape == (8, 2)
    keys = jax.random.split(jax.random.key(1), 2000)
    # Huge log-scale: every sample squashed into [-2, 2]; zero log-scale: std init_std before the squash.
    wide = jax.vmap(head.act, in_axes=(None, 0))(jnp.array([0.0, 50.0]), keys)
    assert wide.shape == (2000, 1) and np.all(np.abs(wide) <= 2.0) and np.abs(wide).max() > 1.99
    u = np.arctanh(np.asarray(jax.vmap(head.act, in_axes=(None, 0))(jnp.array([0.3, 0.0]), keys))[:, 0] / 2.0)
    np.testing.assert_allclose([u.mean(), u.std()], [0.3, head.init_std], atol=0.03)


@pytest.mark.parametrize("task", [BREAKOUT, PENDULUM_GAUSSIAN], ids=["categorical", "gaussian"])
def test_sampled_heads_are_deterministic_given_the_key_and_differ_across_keys_and_episodes(task):
    """The fitness's key decides every sampled action: same key, same returns; new key or episode, new ones."""
    params = task.init_params(jax.random.key(3))
    if task is PENDULUM_GAUSSIAN:  # a wide Gaussian, so the sampled torques matter to the return
        params = {**params, "out": {**params["out"], "b": jnp.array([0.0, 1.0])}}
    stats = task.init_fitness_state().obs
    a, b = (rollout(task, params, jax.random.key(k), stats) for k in (5, 5))
    c = rollout(task, params, jax.random.key(6), stats)
    np.testing.assert_array_equal(a.returns, b.returns)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    assert not np.array_equal(a.returns, c.returns)
    assert len(np.unique(np.asarray(a.returns))) > 1  # episodes of one evaluation draw their own actions
    if task is BREAKOUT:  # with argmax actions only the two start states differ between episodes
        greedy = dataclasses.replace(task, policy=dataclasses.replace(task.policy, head=DiscreteHead(3, "argmax")))
        assert len(np.unique(np.asarray(rollout(greedy, params, jax.random.key(5), stats).returns))) <= 2


def test_categorical_fitness_is_a_function_of_the_key_it_is_called_with():
    """As es.evolve calls it, one key per member: equal params, different keys, different fitnesses."""
    params = BREAKOUT.init_params(jax.random.key(0))
    fitness_state = BREAKOUT.init_fitness_state()
    fitness = jax.jit(jax.vmap(BREAKOUT.mean_return, in_axes=(None, 0, None)))
    keys = jax.random.split(jax.random.key(1), 16)
    values = np.asarray(fitness(params, keys, fitness_state))
    assert len(np.unique(values)) > 1
    np.testing.assert_array_equal(values, np.asarray(fitness(params, keys, fitness_state)))


def test_action_selection_must_match_the_action_space():
    with pytest.raises(ValueError, match=r"Pendulum-v1 has Box actions; use one of \['tanh', 'gaussian'\]"):
        tasks.make("Pendulum-v1", action_selection="categorical")
    with pytest.raises(ValueError, match=r"CartPole-v1 has Discrete actions; use one of \['argmax', 'categorical'\]"):
        tasks.make("CartPole-v1", action_selection="gaussian")
    with pytest.raises(ValueError, match=r"tasks\.make\('CartPole-v1', action_selection='softmax'\) is unknown; use one"):
        tasks.make("CartPole-v1", action_selection="softmax")


# ------------------------------------------------------------ MinAtar defaults


MINATAR_IDS = sorted(e for e in gymnax.registered_envs if e.endswith("-MinAtar"))
