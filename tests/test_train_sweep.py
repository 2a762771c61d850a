"""python -m experiments.train --seeds/--sweep: one program for the grid, one run directory per run, the
comparison plot, resume, and clear errors for what a sweep cannot vary."""

import json
import shutil

import numpy as np
import pytest
import yaml

from experiments import grid, train
from experiments.config import ConfigError

CONFIG = """
task: {name: sphere, options: {dim: 6}}
strategy: {popsize: 8, sigma: 0.1, optimizer: {name: adam, learning_rate: 0.05}}
run: {generations: 6, seed: 0, segment: 2, keep_checkpoints: 2}
"""
GRID = ["--seeds", "0-1", "--sweep", "strategy.sigma=0.05,0.1"]
RUNS = ["strategy.sigma=0.05_seed0", "strategy.sigma=0.05_seed1", "strategy.sigma=0.1_seed0", "strategy.sigma=0.1_seed1"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "tiny.yaml"
    path.write_text(CONFIG)
    return path


def rows(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "time_s"} for line in lines]


def params(run_dir):
    with np.load(run_dir / "params.npz") as data:
        return {name: data[name].tobytes() for name in data.files}


@pytest.fixture(scope="module")
def sweep(config_path, tmp_path_factory):
    """A finished sweep of 2 seeds x 2 sigmas (also the smoke test of the CLI's sweep mode)."""
    sweep_dir = tmp_path_factory.mktemp("runs") / "sweep"
    assert train.main([str(config_path), *GRID, "--run-dir", str(sweep_dir), "--no-progress"]) == 0
    return sweep_dir


@pytest.mark.slow
def test_a_sweep_writes_one_run_directory_per_run_and_the_comparison_plot(sweep):
    assert {p.name for p in sweep.iterdir()} == {*RUNS, "sweep.yaml", "comparison.png"}
    assert (sweep / "comparison.png").read_bytes()[:8] == PNG
    for name in RUNS:
        run_dir = sweep / name
        assert {p.name for p in run_dir.iterdir()} == {
            "config.yaml", "metrics.jsonl", "checkpoints", "params.npz", "learning_curve.png"}
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert name == f"strategy.sigma={config['strategy']['sigma']}_seed{config['run']['seed']}"
        assert [row["generation"] for row in rows(run_dir)] == list(range(6))
    assert grid.groups(sweep) == {"strategy.sigma=0.05": [sweep / RUNS[0], sweep / RUNS[1]],
                                  "strategy.sigma=0.1": [sweep / RUNS[2], sweep / RUNS[3]]}


def test_a_run_of_the_sweep_equals_the_same_run_trained_alone(sweep, config_path, tmp_path):
    alone = tmp_path / "alone"
    assert train.main([str(config_path), "--set", "strategy.sigma=0.1", "--set", "run.seed=1", "--run-dir", str(alone),
                       "--no-progress"]) == 0
    assert rows(alone) == rows(sweep / "strategy.sigma=0.1_seed1")
    assert params(alone) == params(sweep / "strategy.sigma=0.1_seed1")


def test_a_sweep_killed_between_its_runs_checkpoints_resumes_to_the_uninterrupted_result(sweep, config_path,
                                                                                         tmp_path):
    stopped = tmp_path / "stopped"
    assert train.main([str(config_path), *GRID, "--set", "run.generations=4", "--run-dir", str(stopped),
                       "--no-progress"]) == 0
    # As if killed after the first run's checkpoint of generation 4 was written, before the second run's.
    shutil.rmtree(stopped / RUNS[1] / "checkpoints" / "4")
    (stopped / RUNS[1] / "params.npz").unlink()
    assert train.main(["--resume", str(stopped), "--set", "run.generations=6", "--no-progress"]) == 0
    for name in RUNS:
        assert rows(stopped / name) == rows(sweep / name), name
        assert params(stopped / name) == params(sweep / name), name
    assert (stopped / "comparison.png").read_bytes()[:8] == PNG


@pytest.mark.parametrize("flags, message", [
    (["--sweep", "strategy.popsize=8,16"], "strategies[1].popsize=16 but strategies[0].popsize=8"),
    (["--sweep", "task.options.dim=4,5"], "--sweep task.options.dim: a sweep varies strategy settings"),
    (["--sweep", "strategy.sigm=0.1,0.2"], "unknown key 'strategy.sigm'"),
    (["--seeds", "3-1"], "--seeds '3-1': give seeds >= 0 as a range or a list"),
])
def test_what_a_sweep_cannot_vary_exits_2_naming_it(config_path, tmp_path, capsys, flags, message):
    assert train.main([str(config_path), *flags, "--run-dir", str(tmp_path / "x"), "--no-progress"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_seeds_and_sweep_values_parse_as_ranges_lists_and_yaml():
    assert grid.parse_seeds("0-3,8,2") == [0, 1, 2, 3, 8]
    assert grid.parse_sweep(["strategy.sigma=0.05, 1e-1", "strategy.noise=prng,{name: table, size: 64}"]) == {
        "strategy.sigma": [0.05, 0.1], "strategy.noise": ["prng", {"name": "table", "size": 64}]}
    for bad in (["strategy.sigma"], ["strategy.sigma=0.1,0.1"], ["strategy.sigma=1", "strategy.sigma=2"]):
        with pytest.raises(ConfigError, match="--sweep strategy.sigma"):
            grid.parse_sweep(bad)
