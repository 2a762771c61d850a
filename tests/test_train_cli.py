"""The training CLI in subprocesses: a run killed with SIGKILL or stopped with SIGTERM resumes bit for bit."""

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import xla_flags_without_device_count

pytestmark = pytest.mark.slow  # make test-fast leaves it out: the training CLI in child processes

ROOT = pathlib.Path(__file__).resolve().parents[1]
GENERATIONS = 40
CONFIG = f"""
task: {{name: sphere, options: {{dim: 6}}}}
strategy: {{popsize: 8, sigma: 0.1, optimizer: {{name: adam, learning_rate: 0.05}}}}
run: {{generations: {GENERATIONS}, seed: 0, segment: 2, keep_checkpoints: 2}}
"""
TIMEOUT = 180


CHILD_ENV = {"JAX_NUM_CPU_DEVICES": "2"}


def child_env():
    """Two CPU devices in the child (not the 8 of this test session); the suite's compilation cache is in the
    environment (tests/conftest.py), so only the first child compiles a program."""
    return {**os.environ, "XLA_FLAGS": xla_flags_without_device_count(), **CHILD_ENV}


def train(*args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "experiments.train", *map(str, args), "--no-progress"],
                            cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kwargs)


def finish(process):
    out, err = process.communicate(timeout=TIMEOUT)
    return process.returncode, out + (err or "")


def checkpoints(run_dir):
    directory = run_dir / "checkpoints"
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.is_dir() else []


def wait_for_first_checkpoint(process, run_dir, after=0):
    """Until a checkpoint of a generation > ``after`` is on disk."""
    deadline = time.monotonic() + TIMEOUT
    while not checkpoints(run_dir) or checkpoints(run_dir)[-1] <= after:
        assert process.poll() is None, finish(process)
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.01)


def metric_rows(run_dir):
    """The logged metrics (without wall-clock times), one dict per line, and the raw lines."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return [{k: v for k, v in row.items() if k != "time_s"} for row in rows], lines


def params(run_dir):
    with np.load(run_dir / "params.npz") as data:
        return {name: data[name] for name in data.files}


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "tiny.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture(scope="module")
def reference(config_path, tmp_path_factory):
    """An uninterrupted run of the CLI (also its smoke test)."""
    run_dir = tmp_path_factory.mktemp("runs") / "reference"
    code, output = finish(train(config_path, "--run-dir", run_dir))
    assert code == 0, output
    return run_dir


def test_cli_writes_the_run_directory_and_plots_runs(reference, tmp_path):
    assert {p.name for p in reference.iterdir()} == {
        "config.yaml", "metrics.jsonl", "checkpoints", "params.npz", "learning_curve.png"}
    rows, _ = metric_rows(reference)
    assert [row["generation"] for row in rows] == list(range(GENERATIONS))
    assert checkpoints(reference) == [GENERATIONS - 2, GENERATIONS]
    assert set(params(reference)) == {"params", "best_params"}
    assert (reference / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    output = tmp_path / "both.png"
    plot = subprocess.run([sys.executable, "-m", "experiments.plot", reference, reference, "-o", output],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert plot.returncode == 0, plot.stderr
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def assert_resumes_to_the_reference(run_dir, reference, lines_before, resume=None):
    code, output = finish(resume or train("--resume", run_dir))
    assert code == 0, output
    rows, lines = metric_rows(run_dir)
    reference_rows, _ = metric_rows(reference)
    assert rows == reference_rows  # every generation once, with exactly the uninterrupted values
    params_now, params_reference = params(run_dir), params(reference)
    for name in params_reference:
        assert params_now[name].tobytes() == params_reference[name].tobytes(), name
    # It resumed rather than restarted: the checkpointed lines (times included) are the killed run's.
    assert lines[: len(lines_before)] == lines_before
    return output


def test_resume_is_bit_identical_after_sigkill(config_path, reference, tmp_path):
    run_dir = tmp_path / "killed"
    process = train(config_path, "--run-dir", run_dir)
    wait_for_first_checkpoint(process, run_dir)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=TIMEOUT)
    checkpointed = checkpoints(run_dir)[-1]
    assert checkpointed < GENERATIONS, "the run finished before it was killed"
    assert not (run_dir / "params.npz").exists()
    lines = (run_dir / "metrics.jsonl").read_text().split("\n")[:checkpointed]  # the last line may be cut
    assert len(lines) == checkpointed, "the log must reach the checkpoint"
    assert_resumes_to_the_reference(run_dir, reference, lines)


def test_sigterm_finishes_the_segment_checkpoints_and_exits_143(config_path, reference, tmp_path):
    run_dir = tmp_path / "stopped"
    process = train(config_path, "--run-dir", run_dir)
    wait_for_first_checkpoint(process, run_dir)
    process.send_signal(signal.SIGTERM)
    code, output = finish(process)
    assert code == 128 + signal.SIGTERM, output
    assert "stopped by SIGTERM" in output and f"--resume {run_dir}" in output
    stopped_at = checkpoints(run_dir)[-1]
    assert stopped_at < GENERATIONS and stopped_at % 2 == 0
    rows, lines = metric_rows(run_dir)
    assert [row["generation"] for row in rows] == list(range(stopped_at))  # log == checkpoint
    assert not (run_dir / "params.npz").exists()
    assert_resumes_to_the_reference(run_dir, reference, lines)


def test_a_second_sigterm_ends_a_segment_that_would_run_for_minutes_with_143_and_no_abort(config_path, tmp_path):
    """XLA cannot stop a compiled segment, and the interpreter's exit aborted the process under it (SIGABRT, 134,
    C++'s "terminate called"): the process now ends with the second signal's status, its last lines printed."""
    run_dir = tmp_path / "at_once"
    process = train(config_path, "--set", "run.generations=200000000", "--set", "run.segment=100000000",
                    "--run-dir", run_dir)
    assert process.stdout.readline().startswith("sphere(dim=6)")
    time.sleep(3.0)  # compiling, then inside the segment
    process.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    assert process.poll() is None, "the first signal waits for the segment"
    process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    code, output = finish(process)
    assert time.monotonic() - signalled < 20, output
    assert code == 128 + signal.SIGTERM, output
    assert "stopped at once by a second SIGTERM" in output and f"--resume {run_dir}" in output
    assert "terminate called" not in output and "Fatal Python error" not in output
    assert not (run_dir / "params.npz").exists()


def test_bad_set_key_is_refused_before_anything_runs(config_path, tmp_path):
    run_dir = tmp_path / "bad"
    code, output = finish(train(config_path, "--set", "strategy.popsiz=16", "--run-dir", run_dir))
    assert code == 2
    assert "unknown key 'strategy.popsiz'" in output and "did you mean 'popsize'" in output
    assert "Traceback" not in output
    assert not run_dir.exists()


def test_islands_are_refused_with_the_front_end_that_trains_them(config_path, tmp_path):
    run_dir = tmp_path / "islands"
    code, output = finish(train(config_path, "--set", "run.islands=2", "--set", "run.island_generations=1",
                                "--run-dir", run_dir))
    assert code == 2
    assert "python -m experiments.reproduce" in output and "--set run.islands=1" in output
    assert "Traceback" not in output
    assert not run_dir.exists()


def test_the_islands_refusal_names_every_override_a_one_run_train_needs(tmp_path):
    run_dir = tmp_path / "breakout"
    code, output = finish(train("experiments/configs/breakout_minatar.yaml", "--run-dir", run_dir))
    assert code == 2
    assert "--set run.islands=1 --set run.sigma_after_islands=null." in output
    assert "Traceback" not in output
    assert not run_dir.exists()


# --------------------------------------------------------------------------- under es.launch

AUDITED_TRAIN = ROOT / "tests" / "workers" / "train_audited.py"


def launch_train(*args, pid_dir, progress=False):
    """experiments.train as 2 processes x 1 device under es.launch, writes under the run dir audited."""
    command = [sys.executable, "-m", "es.launch", "--processes", "2", "--devices-per-process", "1",
               "--timeout", str(TIMEOUT), "--kill-grace", "2", "--",
               sys.executable, AUDITED_TRAIN, *args, *([] if progress else ["--no-progress"])]
    return subprocess.Popen(list(map(str, command)), cwd=ROOT, env={**child_env(), "ES_TEST_PID_DIR": str(pid_dir)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def rank_pids(pid_dir):
    return [int((pid_dir / f"rank{rank}.pid").read_text()) for rank in (0, 1)]


def gone(pid):
    """Whether process ``pid`` has ended (absent, or a zombie awaiting its reaper)."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def rank_lines(output, rank):
    """What process ``rank`` printed, without gloo's connection notice."""
    prefix = f"[rank {rank}] "
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix) and "[Gloo]" not in line]


def test_multi_process_run_writes_from_process_0_stops_together_and_resumes_after_sigkill(
        config_path, reference, tmp_path):
    """2 processes x 1 device under es.launch, compared with the 1-process reference.

    SIGTERM to process 1 alone stops both after the same segment, checkpointed;
    the resumed job is SIGKILLed (the launcher: the kernel kills the ranks);
    the second resume ends bit for bit at the reference. Process 1 never
    writes under the run directory (audited) and prints nothing.
    """
    run_dir, pid_dir = tmp_path / "run", tmp_path / "pids"
    pid_dir.mkdir()
    job = launch_train(config_path, "--run-dir", run_dir, pid_dir=pid_dir, progress=True)
    wait_for_first_checkpoint(job, run_dir)
    os.kill(rank_pids(pid_dir)[1], signal.SIGTERM)
    code, stopped_output = finish(job)
    assert code == 128 + signal.SIGTERM, stopped_output
    stopped_at = checkpoints(run_dir)[-1]
    assert 0 < stopped_at < GENERATIONS
    rows, lines = metric_rows(run_dir)
    assert [row["generation"] for row in rows] == list(range(stopped_at))  # log == checkpoint
    assert not (run_dir / "params.npz").exists()
    said = rank_lines(stopped_output, 0)
    assert any(line.startswith("process 1 received SIGTERM: finishing the segment") for line in said), said
    assert f"stopped by SIGTERM at generation {stopped_at} (checkpointed); continue with: " \
           f"python -m experiments.train --resume {run_dir}" in said
    assert any("gen/s" in line for line in said), "process 0 shows the progress bar"

    job = launch_train("--resume", run_dir, pid_dir=pid_dir)
    wait_for_first_checkpoint(job, run_dir, after=stopped_at)
    pids = rank_pids(pid_dir)
    job.kill()
    _, killed_output = finish(job)
    deadline = time.monotonic() + 10
    while not all(gone(pid) for pid in pids):
        assert time.monotonic() < deadline, "the ranks outlived their launcher"
        time.sleep(0.05)
    killed_at = checkpoints(run_dir)[-1]
    assert stopped_at < killed_at < GENERATIONS, "the run finished before it was killed"
    lines = (run_dir / "metrics.jsonl").read_text().split("\n")[:killed_at]

    final_output = assert_resumes_to_the_reference(
        run_dir, reference, lines, resume=launch_train("--resume", run_dir, pid_dir=pid_dir))
    assert rank_lines(final_output, 1) == ["audit: process 1 made 0 writes"], final_output
    written = [line for line in rank_lines(final_output, 0) if line.startswith("audit: process 0 made ")]
    assert len(written) == 1 and int(written[0].split()[4]) > 0, "the audit sees process 0's writes"
    for output in (stopped_output, killed_output, final_output):
        assert "audit: process 1 wrote" not in output
        assert rank_lines(output, 1) in ([], ["audit: process 1 made 0 writes"]), output
        assert sum(line.startswith("run dir: ") for line in rank_lines(output, 0)) == 1, output


def test_any_strategy_trains_and_resumes_from_the_cli(config_path, tmp_path):
    """`strategy: {name: PGPE, ...}` through a whole-section --set: trains, then --resume extends it."""
    run_dir = tmp_path / "pgpe"
    pgpe = "--set=strategy={name: PGPE, popsize: 8, sigma: 0.2}"
    code, output = finish(train(config_path, pgpe, "--set=run.generations=4", "--run-dir", run_dir))
    assert code == 0, output
    assert "PGPE popsize 8" in output
    code, output = finish(train("--resume", run_dir, "--set=run.generations=6"))
    assert code == 0, output
    assert "done: 6 generations" in output and checkpoints(run_dir)[-1] == 6
    assert "name: PGPE" in (run_dir / "config.yaml").read_text()


# --------------------------------------------------------------------------- the run directory is the user's data

def snapshot(directory):
    """Every file under ``directory`` (path -> bytes) and every directory: to compare byte for byte."""
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None for p in directory.rglob("*")}


def train_here(*args):
    """experiments.train in this process (8 emulated devices): ``(exit status, stdout + stderr)``."""
    import contextlib
    import io

    from experiments import train as train_module

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = train_module.main([*map(str, args), "--no-progress"])
    return code, out.getvalue() + err.getvalue()


def test_a_refused_resume_leaves_the_run_directory_byte_for_byte(config_path, tmp_path):
    run_dir = tmp_path / "run"
    assert train_here(config_path, "--set", "run.generations=6", "--run-dir", run_dir)[0] == 0
    before = snapshot(run_dir)
    for flags, message in [(["--set", "run.generations=4"], "already done 6 generations"),
                           (["--set", "strategy.sigma=0.2"], "strategy.sigma: the run has 0.1, now has 0.2"),
                           ([config_path, "--set", "run.seed=3"], "seed: the run has 0, now has 3")]:
        code, output = train_here("--resume", run_dir, *flags)
        assert code == 2 and message in output and "Traceback" not in output, output
        assert snapshot(run_dir) == before, flags
    code, output = train_here("--resume", run_dir, "--set", "run.generations=8")  # the next resume is unaffected
    assert code == 0 and "resuming at generation 6" in output, output


def test_a_refused_sweep_resume_leaves_the_sweep_directory_byte_for_byte(config_path, tmp_path):
    sweep_dir = tmp_path / "sweep"
    assert train_here(config_path, "--seeds", "0-1", "--set", "run.generations=4", "--run-dir", sweep_dir)[0] == 0
    before = snapshot(sweep_dir)
    code, output = train_here("--resume", sweep_dir, "--set", "run.generations=2")
    assert code == 2 and "already done 4 generations" in output, output
    assert snapshot(sweep_dir) == before


def test_a_run_whose_config_yaml_is_lost_resumes_from_its_checkpoints(config_path, tmp_path):
    run_dir, straight = tmp_path / "run", tmp_path / "straight"
    assert train_here(config_path, "--set", "run.generations=8", "--run-dir", straight)[0] == 0
    assert train_here(config_path, "--set", "run.generations=4", "--run-dir", run_dir)[0] == 0
    (run_dir / "config.yaml").unlink()
    code, output = train_here("--resume", run_dir, config_path, "--set", "run.generations=6")  # with the CONFIG
    assert code == 0, output
    assert "generations: 6" in (run_dir / "config.yaml").read_text()  # restored once the resume was accepted
    (run_dir / "config.yaml").unlink()
    code, output = train_here("--resume", run_dir, "--set", "run.generations=8")  # rebuilt from the checkpoint
    assert code == 0, output
    assert metric_rows(run_dir)[0] == metric_rows(straight)[0]
    assert params(run_dir)["params"].tobytes() == params(straight)["params"].tobytes()
    restored = (run_dir / "config.yaml").read_text()
    assert "name: sphere" in restored and "learning_rate: 0.05" in restored


def test_a_popsize_too_large_by_construction_is_refused_at_once_without_allocating(config_path, tmp_path):
    import resource

    for popsize in (2**31, 10**12):
        high_water = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
        start = time.monotonic()
        code, output = train_here(config_path, "--set", f"strategy.popsize={popsize}", "--run-dir", tmp_path / "x")
        assert code == 2 and "popsize must be at most 1,073,741,824" in output, output
        assert time.monotonic() - start < 5
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - high_water < 100 * 1024
    assert not (tmp_path / "x").exists()


def test_damage_anywhere_falls_back_with_one_line_per_skipped_checkpoint_and_no_orbax_noise(config_path,
                                                                                             reference, tmp_path):
    run_dir = tmp_path / "damaged"
    code, output = finish(train(config_path, "--set", "run.generations=6", "--set", "run.keep_checkpoints=3",
                                "--run-dir", run_dir))
    assert code == 0, output
    for data in (run_dir / "checkpoints" / "6" / "arrays").rglob("*"):  # 6: arrays unreadable
        if data.is_file() and data.parent.name == "d":
            data.write_bytes(b"\x00garbage" * 8)
    meta = run_dir / "checkpoints" / "4" / "meta" / "metadata"  # 4: a flip that still parses
    meta.write_text(meta.read_text().replace('"maximize"', '"maxymize"'))
    code, output = finish(train("--resume", run_dir, "--set", "run.generations=6"))
    assert code == 0, output
    warned = [line for line in output.splitlines() if line.startswith("warning: ")]
    assert len(warned) == 2, output
    assert "checkpoints/6 is corrupt: its arrays cannot be read" in warned[0]
    assert "checkpoints/4 is corrupt: its metadata does not match its checksum" in warned[1]
    assert all("resuming from the previous intact checkpoint" in line and "(generation 2)" in line for line in warned)
    assert "Traceback" not in output and "Event loop is closed" not in output, output
    assert metric_rows(run_dir)[0] == metric_rows(reference)[0][:6]  # generations 2..6 run again, identical
    assert sorted(p.name for p in (run_dir / "corrupt_checkpoints").iterdir()) == ["4", "6"]


def test_a_full_disk_exits_74_with_one_line_and_the_run_resumes_once_there_is_room(config_path, small_disk):
    disk, remount = small_disk
    run_dir = disk / "run"
    code, output = train_here(config_path, "--set", "run.generations=8", "--run-dir", run_dir)
    assert code == 74, output
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"cannot write {run_dir}/" in errors[0] and "No space left on device" in errors[0]
    assert "--resume" in errors[0] and "Traceback" not in output and "ERROR:absl" not in output, output
    assert not [p for p in run_dir.rglob("*") if p.name.endswith(".tmp") or "orbax-checkpoint-tmp" in p.name]
    remount("size=8m")
    code, output = train_here("--resume", run_dir, config_path, "--set", "run.generations=8")
    assert code == 0, output
    assert [row["generation"] for row in metric_rows(run_dir)[0]] == list(range(8))


def test_a_read_only_run_directory_exits_74_and_is_left_as_it_was(config_path, small_disk):
    disk, remount = small_disk
    remount("size=8m")
    run_dir = disk / "run"
    assert train_here(config_path, "--set", "run.generations=4", "--run-dir", run_dir)[0] == 0
    remount("ro")
    before = snapshot(run_dir)
    code, output = train_here("--resume", run_dir, "--set", "run.generations=6")
    assert code == 74 and f"cannot write {run_dir}/config.yaml: Read-only file system." in output, output
    assert snapshot(run_dir) == before


@pytest.mark.slow
@pytest.mark.parametrize("family", ["Hopper", "HalfCheetah", "Walker2d", "Ant", "Humanoid"])
def test_every_tuned_gymnasium_env_trains_from_the_cli_on_two_devices(family, tmp_path, capsys):
    """The CLI's entry point (experiments.train.main, in this process: 8 emulated devices, run.num_devices 2,
    as a 2-core machine makes every core a device) with the tuned ARS defaults, which a config without a strategy
    section gets (tasks.defaults.GYM_STRATEGY; Ant with its common random numbers), 2 generations of 10-step
    episodes."""
    import es
    from experiments import config as config_lib
    from experiments import train
    from tasks.defaults import GYM_STRATEGY

    config = tmp_path / f"{family}.yaml"
    config.write_text(f'task: {{name: "gymnasium:{family}-v5", options: {{max_steps: 10}}}}\n'
                      "run: {generations: 2, seed: 0, segment: 1, num_devices: 2}\n")
    built = config_lib.build(config_lib.resolve(config_lib.load(config)))
    assert built.strategy == es.ARS(**GYM_STRATEGY[family])
    assert built.task.common_random_numbers == ("generation" if family == "Ant" else None)
    code = train.main([str(config), "--run-dir", str(tmp_path / "run"), "--no-progress"])
    output = capsys.readouterr().out
    assert code == 0, output
    assert "| 2 cpu device(s)" in output, output
    rows, _ = metric_rows(tmp_path / "run")
    assert [row["generation"] for row in rows] == [0, 1]
    assert all(row["num_invalid"] == 0 and math.isfinite(row["fitness_mean"]) for row in rows), rows
