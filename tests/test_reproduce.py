"""experiments.reproduce reads configs as experiments.train does and follows the same run for a seed."""

import json

import chex
import numpy as np
import pytest

from experiments import reproduce, results_report, train

# What train accepts and an older reproduce did not: a noise table, a schedule by its config name, 3e-2 without a dot.
CONFIG = """
task: {name: Pendulum-v1, options: {num_episodes: 1, max_steps: 8, hidden_sizes: [4]}}
strategy:
  popsize: 8
  sigma: {schedule: cosine_decay, init_value: 0.1, decay_steps: 10}
  optimizer: {name: adam, learning_rate: 3e-2}
  noise: {name: table, size: 4096}
run: {generations: 3, seed: 5, segment: 1}
"""


@pytest.mark.slow
def test_reproduce_and_train_run_the_same_generations_for_the_same_config_and_seed(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(CONFIG)
    config, (task, strategy) = reproduce.load_config(path)
    result = reproduce.train(config, task, strategy, seed=5, eval_episodes=2)

    assert train.main([str(path), "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 0
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(logged) == 3 and [p["generation"] for p in result["curve"]] == [0, 1, 2, 3]
    # One segment per generation: reproduce records each generation's population mean, train logs it.
    assert [p["fitness_mean"] for p in result["curve"][1:]] == [row["fitness_mean"] for row in logged]
    assert [p["sigma"] for p in result["curve"][1:]] == [row["sigma"] for row in logged]


def test_islands_keep_the_best_training_fitness_and_go_on_as_that_islands_own_run(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(CONFIG)
    config, (task, strategy) = reproduce.load_config(
        path, overrides=["run.islands=3", "run.island_generations=1", "run.segment=1"])
    result = reproduce.train(config, task, strategy, seed=5, eval_episodes=2)

    islands = result["islands"]
    assert islands["island_seeds"] == [15, 16, 17]
    assert islands["kept"] == int(np.argmax(islands["training_fitness"]))
    assert [p["generation"] for p in result["curve"]] == [0, 1, 2, 3]
    # The kept island is an ordinary run of its own seed: train with that seed logs the same generations.
    kept_seed = islands["island_seeds"][islands["kept"]]
    assert train.main([str(path), "--set", f"run.seed={kept_seed}", "--run-dir", str(tmp_path / "run"),
                       "--no-progress"]) == 0
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [p["fitness_mean"] for p in result["curve"][1:]] == [row["fitness_mean"] for row in logged]
    # Its env steps count every island's: the kept one's run plus the others' first generation.
    own_steps = config["task"]["options"]["max_steps"] * strategy.popsize * 3  # 3 generations, 1 episode each
    assert islands["other_islands_env_steps"] == 2 * own_steps // 3
    assert result["env_steps"] == own_steps + islands["other_islands_env_steps"]


@pytest.mark.slow
def test_sigma_after_islands_restarts_the_kept_islands_strategy_at_that_sigma(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(CONFIG)
    config, (task, strategy) = reproduce.load_config(path, overrides=[
        "strategy.sigma=0.1", "run.islands=2", "run.island_generations=1", "run.segment=1",
        "run.sigma_after_islands=0.25"])
    result = reproduce.train(config, task, strategy, seed=5, eval_episodes=2)

    # The islands' generation ran at the config's sigma, the kept island's next two at sigma_after_islands.
    assert [p["sigma"] for p in result["curve"][1:]] == pytest.approx([0.1, 0.25, 0.25])


def test_restarted_at_sigma_keeps_the_mean_and_fitness_state_and_restarts_only_the_strategy_state():
    import es

    config, (task, strategy) = reproduce.load_config("experiments/configs/breakout_minatar.yaml")
    state = es.init_from_seed(strategy, 0, task.init_params, fitness=task.fitness)
    state = state._replace(strategy_state=state.strategy_state._replace(sigma=state.strategy_state.sigma * 0.5))
    restarted, [after] = reproduce.restarted_at_sigma(strategy, [state], config["run"]["sigma_after_islands"])

    assert isinstance(restarted, es.SNES) and restarted.sigma == 0.3 and restarted.popsize == strategy.popsize
    np.testing.assert_array_equal(np.asarray(after.strategy_state.sigma), 0.3 * np.ones_like(state.strategy_state.sigma))
    for kept in ("params", "generation", "best_fitness", "fitness_state"):
        chex.assert_trees_all_equal(getattr(after, kept), getattr(state, kept))


def test_reproduce_refuses_a_named_config_that_is_not_an_environment(capsys):
    with pytest.raises(SystemExit) as exit:
        reproduce.main(["experiments/configs/demo.yaml", "--no-save"])
    assert exit.value.code == 2
    assert "task 'rastrigin' is not a gymnax environment" in capsys.readouterr().err


def test_reproduce_reports_config_errors_with_the_key(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("task: {name: CartPole-v1}\nstrategy: {popsize: 8, sigma: fast}\n")
    with pytest.raises(SystemExit) as exit:
        reproduce.main([str(path), "--no-save"])
    assert exit.value.code == 2
    assert "strategy.sigma must be a number" in capsys.readouterr().err


def test_strategy_option_swaps_in_that_strategy_at_its_defaults_with_the_config_popsize(tmp_path):
    import es

    path = tmp_path / "tiny.yaml"
    path.write_text(CONFIG)
    config, (task, strategy) = reproduce.load_config(path, generations=2, strategy="SNES")
    assert strategy == es.SNES(popsize=8) and config["strategy"]["name"] == "SNES"
    assert config["task"]["options"]["max_steps"] == 8 and config["run"]["generations"] == 2


def test_comparison_table_bolds_the_best_strategy_and_falls_back_to_the_config_runs():
    def run(env, name, value):
        return {"env": env, "final_return_mean": value, "config": {"strategy": {"name": name}}}

    strategy_runs = {"Pendulum-v1": [run("Pendulum-v1", "SNES", -150.0), run("Pendulum-v1", "SNES", -170.0),
                                     run("Pendulum-v1", "PGPE", -140.0)]}
    runs = {"Pendulum-v1": [run("Pendulum-v1", "OpenES", -147.0)]}
    header, _, row = results_report.comparison_table(strategy_runs, runs).splitlines()
    assert header == "| environment | OpenES | SNES | PGPE | best |"  # no column for a strategy without runs
    assert row == "| `Pendulum-v1` | -147.0 ± 0.0 | -160.0 ± 10.0 | **-140.0 ± 0.0** | PGPE (seeds: 1) |"


def test_comparison_table_names_every_strategy_tied_with_the_best():
    runs = {"CartPole-v1": [{"env": "CartPole-v1", "final_return_mean": 500.0, "config": {"strategy": {"name": n}}}
                            for n in ("OpenES", "SNES", "ARS")]}
    row = results_report.comparison_table(runs, {}).splitlines()[-1]
    assert row.count("**500.0 ± 0.0**") == 3 and row.endswith("| OpenES, SNES, ARS (seeds: 1) |")


def test_the_report_keeps_the_gymnasium_section_another_script_writes(tmp_path):
    from experiments.gymnasium_results import BEGIN, END

    page = tmp_path / "results.md"
    assert results_report.with_kept_sections("# new report\n", page) == "# new report\n"  # no page yet
    page.write_text(f"# old report\n\n{BEGIN}\nHopper: 3,297\n{END}\n\nold notes\n")
    assert results_report.with_kept_sections("# new report\n", page) == f"# new report\n\n{BEGIN}\nHopper: 3,297\n{END}\n"
