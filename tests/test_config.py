"""Experiment configs: defaults, --set overrides with YAML values, and errors that name the key and the choices."""

import dataclasses
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import es
from experiments import config as config_lib

TINY = {"task": {"name": "sphere", "options": {"dim": 4}}, "strategy": {"popsize": 8}}


def resolved(overrides=(), raw=TINY):
    return config_lib.resolve(config_lib.apply_overrides(config_lib.resolve(raw), list(overrides)))


def test_a_registered_task_is_resolved_and_built_without_importing_gymnax():
    """The CLI's config check finds "sphere" without listing gymnax's environments (about a second to import)."""
    code = ("import sys; from experiments import config as c\n"
            "task, _ = c.build(c.resolve({'task': {'name': 'sphere'}, 'strategy': {'popsize': 8}}))\n"
            "import tasks; print(task.dim, tasks.is_name('sphere'), 'gymnax' in sys.modules, tasks.is_name('spher'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=pathlib.Path(__file__).resolve().parents[1]).stdout.split()
    assert out[1:] == ["True", "False", "False"], out


def test_resolve_fills_every_default_and_builds_the_strategy():
    config = resolved()
    assert config["strategy"]["optimizer"] == {"name": "adam", "learning_rate": 0.01}
    assert config["strategy"]["noise"] == {"name": "prng"}
    assert config["strategy"]["name"] == "OpenES"
    assert config["run"] == {"generations": 200, "seed": 0, "num_devices": None, "segment": 50,
                             "keep_checkpoints": 3, "exchange": "fitness", "eval_batch_size": None,
                             "update_batch_size": None, "islands": 1, "island_generations": 0,
                             "sigma_after_islands": None}
    task, strategy = config_lib.build(config)
    assert task.dim == 4
    assert isinstance(strategy, es.OpenES) and strategy.popsize == 8 and strategy.sigma == 0.05


def test_set_overrides_take_yaml_values_and_reach_nested_keys():
    config = resolved([
        "strategy.popsize=16",
        "strategy.antithetic=false",
        "strategy.optimizer.learning_rate=1e-3",  # YAML 1.1 would read this as a string
        "strategy.sigma={schedule: exponential_decay, init_value: 0.5, transition_steps: 10, decay_rate: 0.9}",
        "strategy.noise={name: table, size: 1000}",
        "run.num_devices=null",
    ])
    strategy = config["strategy"]
    assert strategy["popsize"] == 16 and strategy["antithetic"] is False
    assert strategy["optimizer"] == {"name": "adam", "learning_rate": 0.001}
    assert strategy["noise"] == {"name": "table", "size": 1000, "seed": 0}
    _, built = config_lib.build(config)
    assert built.noise == es.NoiseTable(1000, 0)
    assert float(built.sigma_at(built.hyperparameters(4), 10)) == pytest.approx(0.45)


def test_low_rank_noise_has_a_yaml_form():
    config = resolved(["strategy.noise={name: lowrank, factored: true}"])
    assert config["strategy"]["noise"] == {"name": "lowrank", "rank": 1, "factored": True}
    _, built = config_lib.build(config)
    assert built.noise == es.LowRankNoise(rank=1, factored=True)


def test_schedules_map_to_optax_and_reach_optimizer_arguments():
    config = resolved(["strategy.optimizer={name: sgd, momentum: 0.9, learning_rate: "
                       "{schedule: cosine_decay, init_value: 0.1, decay_steps: 100}}"])
    _, strategy = config_lib.build(config)
    # The schedule reached the optimizer: its updates are those of sgd(cosine_decay(0.1, 100), momentum 0.9).
    expected = optax.sgd(optax.cosine_decay_schedule(0.1, 100), momentum=0.9)
    params = jnp.zeros(2)
    states = (strategy.optimizer.init(params), expected.init(params))
    for step in range(60):
        gradient = jnp.full(2, 1.0 + step % 3)
        got, state = strategy.optimizer.update(gradient, states[0], params)
        want, state_expected = expected.update(gradient, states[1], params)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        states = (state, state_expected)  # a dropped schedule (a constant 0.1) differs from step 1 on


@pytest.mark.parametrize("task", ["sphere", "CartPole-v1", "Breakout-MinAtar", "gymnasium:Hopper-v5"])
def test_a_strategy_section_without_popsize_is_the_task_s_default_strategy(task):
    """Without ``strategy.popsize`` the section starts from ``tasks.default_settings``: the task's recommended
    strategy (ARS on gymnasium, SNES on MinAtar), or the named strategy's default for it; the keys given win. The
    resolved section is numbers and names (a run's config.yaml) and builds ``tasks.default_strategy``'s strategy."""
    import tasks

    for section in ({}, {"name": "SNES"}, {"name": "PGPE", "sigma": 0.2}):
        config = config_lib.resolve({"task": {"name": task}, "strategy": section})
        assert config_lib.resolve(config_lib.parse_yaml(config_lib.dump(config), "config.yaml")) == config
        built = config_lib.build(config)
        expected = tasks.default_strategy(built.task, section.get("name"))
        assert built.strategy == (dataclasses.replace(expected, sigma=0.2) if "sigma" in section else expected)


def test_task_overrides_come_first_so_the_default_strategy_is_the_new_task_s():
    config = config_lib.with_overrides({"task": {"name": "CartPole-v1"}}, ["strategy.sigma=0.7", "task.name=sphere"])
    assert config["task"]["name"] == "sphere"
    # the sphere's OpenES (popsize 64), not CartPole's (256); the strategy's override kept
    assert (config["strategy"]["popsize"], config["strategy"]["sigma"]) == (64, 0.7)


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (["strategi.popsize=3"], ["unknown config section 'strategi'", "['task', 'strategy', 'run']",
                                  "did you mean 'strategy'"]),
        (["strategy.popsiz=3"], ["unknown key 'strategy.popsiz'", "'popsize'", "did you mean 'popsize'"]),
        (["strategy.popsize=abc"], ["strategy.popsize must be an int", "'abc'"]),
        (["strategy.antithetic=1"], ["strategy.antithetic must be true or false"]),
        (["run.seed=1.5"], ["run.seed must be an int"]),
        (["strategy.fitness_shaping=rank"], ["strategy.fitness_shaping", "'centered_rank'", "'z_score'"]),
        (["run.exchange=params"], ["run.exchange", "['fitness', 'sharded', 'gradient', 'auto']"]),
        (["strategy.exchange=gradient"], ["unknown key 'strategy.exchange'", "valid keys of strategy (OpenES)"]),
        (["task.name=cartpol"], ["task.name: 'cartpol' is not valid", "'sphere'"]),
        (["strategy.optimizer.name=adamm"], ["unknown optimizer 'adamm'", "'sgd'", "did you mean 'adam'"]),
        (["strategy.optimizer.lr=0.1"], ["strategy.optimizer", "'lr'", "'learning_rate'"]),
        (["strategy.optimizer.learning_rate=fast"], ["strategy.optimizer.learning_rate must be a number or a "
                                                     "schedule", "got 'fast' (str)"]),
        (["strategy.optimizer.b1=high"], ["strategy.optimizer.b1 must be a number", "'high'"]),
        (["strategy.sigma={schedule: cosine, init_value: 1.0}"], ["unknown schedule 'cosine'", "'cosine_decay'"]),
        (["strategy.sigma={schedule: cosine_decay, init_value: 1.0}"], ["strategy.sigma", "'decay_steps'"]),
        (["strategy.sigma={init_value: 1.0}"], ["strategy.sigma", "without 'schedule'"]),
        (["strategy.noise=tabel"], ["strategy.noise", "['prng', 'table', 'lowrank']"]),
        (["strategy.noise={name: lowrank, factored: 1}"], ["strategy.noise.factored must be true or false"]),
        (["strategy.noise={name: table, sise: 5}"], ["unknown key 'strategy.noise.sise'", "'size'"]),
        (["strategy.noise={name: table, size: 0}"], ["strategy.noise", "size=0", "[1, 2**31 - 1]"]),
        (["strategy.sigma.init_value=2"], ["strategy.sigma is 0.05, not a mapping"]),
        (["popsize=3"], ["section.key"]),
        (["strategy.popsize"], ["section.key=value"]),
        (["strategy.popsize=[1"], ["not valid YAML"]),
    ],
)
def test_bad_keys_and_values_are_named_with_the_valid_choices(overrides, fragments):
    with pytest.raises(config_lib.ConfigError) as info:
        resolved(overrides)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (["task.options.dims=3"], ["task.options", "['dims']", "['dim']"]),
        (["strategy.popsize=7"], ["strategy", "popsize", "even"]),
        (["strategy.popsize=2147483648"], ["strategy.popsize", "popsize must be at most 1,073,741,824 (2**30)"]),
        (["strategy.popsize=1000000000000"], ["strategy.popsize", "popsize must be at most 1,073,741,824"]),
        (["strategy.weight_decay=-1"], ["weight_decay", ">= 0"]),
        (["strategy.optimizer.learning_rate=-0.1"], ["strategy.optimizer", "negative learning_rate",
                                                     "use a positive value"]),
        (["strategy.sigma={schedule: cosine_decay, init_value: 1.0, decay_steps: 20}", "run.generations=40"],
         ["strategy.sigma", "0 at generation 20", "alpha > 0"]),
        (["run.segment=0"], ["run.segment must be >= 1"]),
        (["run.islands=0"], ["run.islands must be >= 1"]),
        (["run.islands=4"], ["run.island_generations must be in [1, run.generations)", "got 0",
                             "--set run.island_generations=50"]),
        (["run.islands=4", "run.island_generations=200"], ["run.island_generations", "got 200"]),
        (["run.island_generations=-1"], ["run.island_generations must be >= 0"]),
        (["run.sigma_after_islands=0.3"], ["run.sigma_after_islands", "needs run.islands > 1",
                                            "--set run.islands=6"]),
        (["run.islands=4", "run.island_generations=50", "run.sigma_after_islands=0"],
         ["run.sigma_after_islands must be > 0", "got 0"]),
    ],
)
def test_bad_values_are_refused_when_building(overrides, fragments):
    with pytest.raises(config_lib.ConfigError) as info:
        config_lib.build(resolved(overrides))
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_resolved_config_round_trips_through_yaml(tmp_path):
    config = resolved(["strategy.optimizer.learning_rate=3e-4", "strategy.weight_decay=0.1"])
    path = tmp_path / "config.yaml"
    path.write_text(config_lib.dump(config))
    assert config_lib.resolve(config_lib.load(path)) == config


def test_identity_ignores_what_a_resume_may_change():
    """How the run executes is es.run's to check (its run identity); the config's identity is the rest."""
    base = resolved()
    extended = resolved(["run.generations=400", "run.segment=10", "run.keep_checkpoints=1", "run.num_devices=2",
                         "run.exchange=gradient", "run.eval_batch_size=4"])
    assert config_lib.identity(base) == config_lib.identity(extended)
    assert config_lib.identity(base) != config_lib.identity(resolved(["run.seed=1"]))
    assert config_lib.identity(base) != config_lib.identity(resolved(["strategy.sigma=0.1"]))


def test_the_strategy_section_is_derived_from_each_strategy_s_fields():
    for name, cls in es.STRATEGIES.items():
        schema = config_lib.strategy_schema(name)
        assert list(schema) == ["name", *cls.fields()]
        config = resolved([f"strategy={{name: {name}, popsize: 8}}"])
        _, strategy = config_lib.build(config)
        assert strategy == cls(popsize=8), name  # every default is the dataclass's own
        assert config_lib.resolve(config) == config
    assert config_lib.strategy_schema("PGPE")["optimizer"].default == {"name": "clipup", "learning_rate": 0.15,
                                                                      "max_speed": 0.3}
    assert "top_k" in config_lib.strategy_schema("ARS")["top_k"].help.lower() or config_lib.strategy_schema(
        "ARS")["top_k"].help.startswith("``b``")


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (["strategy={name: SNES, popsize: 8, optimizer: adam}"], ["unknown key 'strategy.optimizer'",
                                                                  "valid keys of strategy (SNES)"]),
        (["strategy.name=SNESS"], ["strategy.name: 'SNESS' is not valid", "did you mean 'SNES'"]),
        (["strategy={name: ARS, popsize: 8, top_k: 9}"], ["strategy: ARS(top_k=9, popsize=8)", "top_k <= 4"]),
        (["strategy={name: SNES, popsize: 8, sigma_learning_rate: fast}"], ["strategy.sigma_learning_rate",
                                                                            "must be a number"]),
        (["strategy={name: SepCMAES, popsize: null}"], ["strategy.popsize must be an int", "got None (null)"]),
        # Only the name switched: the resolved OpenES section's optimizer and shaping stay, which SepCMAES lacks.
        (["strategy.name=SepCMAES"], ["--set strategy.name=SepCMAES", "OpenES's keys ['optimizer'",
                                      "replacing the whole section", "--set 'strategy={name: SepCMAES, popsize: "]),
    ],
)
def test_bad_strategy_sections_name_the_strategy_and_the_key(overrides, fragments):
    with pytest.raises(config_lib.ConfigError) as info:
        config_lib.build(resolved(overrides))
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))
