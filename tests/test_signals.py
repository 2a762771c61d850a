"""What SIGINT and SIGTERM do to an es.run, however long its generations take (runs in child processes).

The first signal stops the run where a checkpoint can next be written: after the generation in progress for a
fitness on the host (inside a long segment), after the segment for a JAX fitness. The second stops it at once,
with the worker processes ended and the last checkpoint intact, even while an evaluation or a segment would run
for minutes more.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import es
from es.runs.checkpoint import Checkpointer
from helpers import wait_until_dead, xla_flags_without_device_count

REPO = Path(__file__).resolve().parents[1]
WORKER = str(REPO / "tests" / "workers" / "signals_run.py")
STARTUP_S = 120  # the child imports JAX and compiles: generous on a loaded 2-core machine
AT_ONCE_S = 20  # the second signal to the process's exit (measured 1-3 s; the bound catches a hang)

pytestmark = pytest.mark.slow


def start(tmp_path, kind: str, segment: int, generations: int = 200) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ES_")}
    env.update(PYTHONPATH=str(REPO), JAX_NUM_CPU_DEVICES="1", XLA_FLAGS=xla_flags_without_device_count())
    return subprocess.Popen([sys.executable, WORKER, str(tmp_path), "--kind", kind, "--segment", str(segment),
                             "--generations", str(generations)],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, child: subprocess.Popen, what: str, timeout: float = STARTUP_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if child.poll() is not None:
            raise AssertionError(f"the child ended before {what}: {child.communicate()}")
        if time.monotonic() > deadline:
            child.kill()
            raise AssertionError(f"no {what} within {timeout:.0f} s: {child.communicate()}")
        time.sleep(0.05)


def signal_twice(child: subprocess.Popen, signum: int) -> tuple[str, str, float]:
    """The first ``signum``, a check that the child goes on, the second: ``(stdout, stderr, seconds from the
    second signal to the child's exit)``."""
    child.send_signal(signum)
    time.sleep(1.0)
    assert child.poll() is None, "the first signal waits for the generation or segment in progress"
    child.send_signal(signum)
    signalled = time.monotonic()
    stdout, stderr = child.communicate(timeout=AT_ONCE_S)
    return stdout, stderr, time.monotonic() - signalled


STRATEGY_POPSIZE = 8  # tests/workers/signals_run.py's STRATEGY


def checkpoints(tmp_path) -> list[int]:
    directory = tmp_path / "run" / "checkpoints"
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.is_dir() else []


def worker_pids(tmp_path) -> list[int]:
    directory = tmp_path / "pids"
    return [int(p.name) for p in directory.iterdir()] if directory.is_dir() else []


def stuck_then_signalled_twice(tmp_path, child: subprocess.Popen, checkpoint: int, signum: int):
    """Once checkpoint ``checkpoint`` is written, ``OUT_DIR/hang`` makes every later member take minutes; 3 s on (the
    generation or segment in progress ends: 0.8 s of host members, milliseconds of a JAX segment) the last
    checkpoint is read and ``signal_twice`` sends ``signum``: ``(last, stdout, stderr, seconds to the exit)``. The
    child is killed whatever happens."""
    try:
        wait_for(lambda: checkpoints(tmp_path) and checkpoints(tmp_path)[-1] >= checkpoint, child,
                 f"checkpoint {checkpoint}")
        (tmp_path / "hang").touch()
        time.sleep(3.0)
        return (checkpoints(tmp_path)[-1], *signal_twice(child, signum))
    finally:
        child.kill()


def assert_kept(tmp_path, last: int) -> None:
    """No checkpoint after ``last`` was written, and ``last`` restores a finite state of its generation."""
    assert checkpoints(tmp_path)[-1] == last
    checkpointer = Checkpointer(tmp_path / "run" / "checkpoints", writer=False)
    try:
        like = es.OpenES(popsize=STRATEGY_POPSIZE, sigma=0.1).init(jax.random.key(0), {"x": np.zeros(5, np.float32)})
        restored = checkpointer.restore(last, like)
    finally:
        checkpointer.close()
    assert int(restored.state.generation) == last and np.all(np.isfinite(np.asarray(restored.state.params["x"])))


def test_a_first_signal_stops_a_host_fitness_run_after_the_generation_in_progress_inside_its_segment(tmp_path):
    child = start(tmp_path, "host", segment=50)
    try:
        wait_for(lambda: worker_pids(tmp_path), child, "evaluation")
        time.sleep(1.0)  # a generation takes about 0.8 s (8 members of 0.2 s on 2 workers)
        child.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        in_progress = len((tmp_path / "evaluated").read_text().splitlines()) // STRATEGY_POPSIZE  # 0-based
        stdout, stderr = child.communicate(timeout=STARTUP_S)
        acted_s = time.monotonic() - signalled
    finally:
        child.kill()
    assert child.returncode == 0, stderr[-3000:]
    stopped = [line for line in stdout.splitlines() if line.startswith("stopped_by")]
    assert stopped and stopped[0].startswith(f"stopped_by {int(signal.SIGINT)} at generation"), stdout
    generation = int(stopped[0].split()[-1])
    assert 1 <= generation < 50, "stopped inside the first segment of 50 generations, at a generation's end"
    assert generation <= in_progress + 2, (generation, in_progress)  # that generation's end (+1: a member's race)
    assert checkpoints(tmp_path) == [generation]
    assert "finishing the generation in progress" in stderr
    assert acted_s < AT_ONCE_S, acted_s
    assert not wait_until_dead(worker_pids(tmp_path))


def test_a_second_signal_ends_a_stuck_host_evaluation_at_once_and_keeps_the_last_checkpoint(tmp_path):
    child = start(tmp_path, "host", segment=1)
    last, stdout, stderr, acted_s = stuck_then_signalled_twice(tmp_path, child, 2, signal.SIGTERM)
    assert child.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert acted_s < AT_ONCE_S
    assert "stopped_by" not in stdout
    assert not wait_until_dead(worker_pids(tmp_path)), "workers outlived the second signal"
    assert_kept(tmp_path, last)


def test_a_second_signal_ends_a_jax_segment_that_would_run_for_minutes_and_keeps_the_last_checkpoint(tmp_path):
    child = start(tmp_path, "jax", segment=2, generations=10**6)  # never ends by itself
    last, stdout, stderr, acted_s = stuck_then_signalled_twice(tmp_path, child, 4, signal.SIGINT)
    assert child.returncode == 128 + signal.SIGINT and "KeyboardInterrupt" in stderr, stderr[-3000:]
    assert "terminate called" not in stderr and "Fatal Python error" not in stderr  # the exit's abort, before
    assert acted_s < AT_ONCE_S
    assert "stopped_by" not in stdout
    assert_kept(tmp_path, last)
