"""tasks.default_strategy(task, name): each strategy's documented default, and a clear error for unknown names."""

import jax.numpy as jnp
import optax
import pytest

import es
import tasks

# The values documented in tasks.default_strategy's docstring and docs/tasks.md.
ENV_DOCUMENTED = {
    "OpenES": {"popsize": 256, "sigma": 0.1, "step": 0.03},
    "SNES": {"popsize": 256, "sigma": 0.1, "learning_rate": 1.0, "sigma_learning_rate": None},
    "PGPE": {"popsize": 128, "sigma": 0.1, "step": 0.15},
    "ARS": {"popsize": 256, "sigma": 0.05, "learning_rate": 0.05, "top_k": 32},
    "SepCMAES": {"popsize": 256, "sigma": 0.1},
    "CMAES": {"popsize": 64, "sigma": 0.1},
}
WIDTH = 10.0  # the sphere's box [-5, 5]
FUNCTION_DOCUMENTED = {
    "OpenES": {"popsize": 64, "sigma": 0.05 * WIDTH, "step": 0.01 * WIDTH},
    "SNES": {"popsize": 64, "sigma": 0.1 * WIDTH, "learning_rate": 1.0},
    "PGPE": {"popsize": 64, "sigma": 0.1 * WIDTH, "step": 0.01 * WIDTH},
    "ARS": {"popsize": 64, "sigma": 0.05 * WIDTH, "learning_rate": 0.01 * WIDTH, "top_k": None},
    "SepCMAES": {"popsize": 64, "sigma": 0.3 * WIDTH},
    "CMAES": {"popsize": 64, "sigma": 0.3 * WIDTH},
}


def first_step(optimizer) -> float:
    """Length of the optimizer's first update of a one-parameter model: adam's and ClipUp's learning rate."""
    params = jnp.zeros(1)
    updates, _ = optimizer.update(jnp.ones(1), optimizer.init(params), params)
    return float(optax.tree.norm(updates))


def check_documented(strategy, name, documented):
    assert type(strategy) is es.STRATEGIES[name]
    for key, value in documented.items():
        if key == "step":
            assert first_step(strategy.optimizer) == pytest.approx(value, rel=1e-5), key
        elif value is None:
            assert getattr(strategy, key) is None, key
        else:
            assert getattr(strategy, key) == pytest.approx(value), key
    assert strategy.maximize  # tasks' fitnesses are to be maximised


@pytest.mark.parametrize("name", list(es.STRATEGIES))
@pytest.mark.slow
def test_each_named_default_is_that_strategy_with_the_documented_values(name):
    check_documented(tasks.default_strategy(tasks.make("CartPole-v1"), name), name, ENV_DOCUMENTED[name])
    check_documented(tasks.default_strategy(tasks.make("sphere", dim=3), name), name, FUNCTION_DOCUMENTED[name])


def test_pgpe_env_default_keeps_pgpe_own_clipup():
    strategy = tasks.default_strategy(tasks.make("Pendulum-v1"), "PGPE")
    assert strategy.describe()["optimizer"] == {"name": "clipup", "learning_rate": 0.15, "max_speed": 0.3}


def test_no_name_gives_the_recommended_openes():
    for task in (tasks.make("CartPole-v1"), tasks.make("rastrigin", dim=5)):
        recommended = tasks.default_strategy(task)
        named = tasks.default_strategy(task, "OpenES")
        assert type(recommended) is es.OpenES
        assert (recommended.popsize, recommended.sigma) == (named.popsize, named.sigma)
        assert first_step(recommended.optimizer) == first_step(named.optimizer)


@pytest.mark.parametrize("bad", ["CMA_ES", "openes", 3])
def test_an_unknown_name_is_refused_naming_the_argument_and_the_choices(bad):
    with pytest.raises(ValueError, match=r"tasks\.default_strategy\(name=.*\) is unknown; use one of \['OpenES', "
                                         r"'SNES', 'PGPE', 'ARS', 'SepCMAES', 'CMAES'\]"):
        tasks.default_strategy(tasks.make("sphere"), bad)


def test_image_observations_get_snes_and_gymnax_vectors_keep_openes():
    breakout, cartpole = tasks.make("Breakout-MinAtar"), tasks.make("CartPole-v1")
    assert breakout.image_observations and not cartpole.image_observations
    assert tasks.defaults.recommended(breakout) == "SNES"
    check_documented(tasks.default_strategy(breakout), "SNES", ENV_DOCUMENTED["SNES"])
    assert type(tasks.default_strategy(cartpole)) is es.OpenES
    assert breakout.policy.head.selection == "categorical"  # sampled actions: members of a plateau do not tie
    assert breakout.policy.hidden_sizes == () and cartpole.policy.hidden_sizes == (64, 64)  # linear on images
    assert tasks.make("Breakout-MinAtar", policy="cnn").policy.hidden_sizes == (64,)
    assert tasks.make("Breakout-MinAtar", hidden_sizes=(32,)).policy.hidden_sizes == (32,)


# tasks.default_strategy on gymnasium tasks: es.ARS, (popsize = 2 x directions, top_k, learning_rate, sigma), as
# documented in tasks/defaults.py and docs/tasks.md; every version of a family (the id before "-v") alike.
GYM_TUNED = {
    "Hopper-v5": (16, 4, 0.01, 0.025),
    "HalfCheetah-v5": (64, 4, 0.02, 0.03),
    "Walker2d-v5": (80, 30, 0.03, 0.025),
    "Walker2d-v4": (80, 30, 0.03, 0.025),
    "Ant-v5": (120, 20, 0.015, 0.025),
    "Humanoid-v5": (460, 230, 0.02, 0.0075),
}
GYM_FALLBACK = (16, 4, 0.02, 0.03)


@pytest.mark.filterwarnings("ignore:.*Walker2d-v4 is out of date")
@pytest.mark.parametrize("env_id", [*GYM_TUNED, "InvertedDoublePendulum-v5", "Swimmer-v5", "Pendulum-v1"])
def test_gymnasium_envs_get_ars_with_their_tuned_settings_or_the_documented_fallback(env_id):
    strategy = tasks.default_strategy(tasks.make(f"gymnasium:{env_id}"))
    assert type(strategy) is es.ARS and strategy.maximize
    expected = GYM_TUNED.get(env_id, GYM_FALLBACK)
    assert (strategy.popsize, strategy.top_k, strategy.learning_rate, strategy.sigma) == pytest.approx(expected)


def test_only_the_documented_gymnasium_families_are_tuned_and_other_strategies_keep_their_env_defaults():
    assert set(tasks.defaults.GYM_STRATEGY) == {"Hopper", "HalfCheetah", "Walker2d", "Ant", "Humanoid"}
    ant = tasks.make("gymnasium:Ant-v5")
    for name in ("OpenES", "SNES", "SepCMAES"):
        check_documented(tasks.default_strategy(ant, name), name, ENV_DOCUMENTED[name])
