"""Multi-process runs: es.distributed and the es.launch launcher.

Every configuration compared runs in fresh processes (this test session has
8 emulated devices in-process); each child has a hard timeout.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import xla_flags_without_device_count

import es
import es.engine.execution
from es.parallel import launch

pytestmark = pytest.mark.slow  # make test-fast leaves it out: multi-process runs in child processes

REPO = Path(__file__).resolve().parents[1]
WORKER = str(REPO / "tests" / "workers" / "evolve_run.py")
CHILD_TIMEOUT = 150  # seconds; compile-bound runs take ~10-40 s on 2 loaded cores
KILL_GRACE = 2.0  # launcher's SIGTERM -> SIGKILL grace in these tests


def child_env(**extra) -> dict:
    """This worktree's ``es`` first on the path; no inherited device-count or ES_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ES_") and not k.startswith("SLURM_")}
    env.pop("JAX_NUM_CPU_DEVICES", None)
    env["XLA_FLAGS"] = xla_flags_without_device_count()
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def launcher(*args: str) -> list[str]:
    return [sys.executable, "-m", "es.launch", "--kill-grace", str(KILL_GRACE), *args]


def load_npz(path: Path) -> dict:
    with np.load(path) as data:
        return dict(data)


def two_processes_and_one(tmp_path: Path, worker: list[str], *report: str) -> dict:
    """Run ``worker`` as 2 processes x 1 device (under the launcher) and as 1 process x 1 device; assert both
    exit 0 and that every array each rank saved equals the 1-process run's, bit for bit. Its arrays."""
    runs = {"2x1": tmp_path / "2x1", "1x1": tmp_path / "1x1"}
    for path in runs.values():
        path.mkdir()
    procs = {
        "2x1": subprocess.Popen(
            launcher("--processes", "2", "--timeout", str(CHILD_TIMEOUT), "--", sys.executable, worker[0],
                     str(runs["2x1"]), *worker[1:], *report),
            env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        "1x1": subprocess.Popen([sys.executable, worker[0], str(runs["1x1"]), *worker[1:]],
                                env=child_env(JAX_NUM_CPU_DEVICES="1"), cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True),
    }
    for name, proc in procs.items():
        output = proc.communicate(timeout=CHILD_TIMEOUT + 10)[0]
        assert proc.returncode == 0, f"{name}:\n{output[-3000:]}"
    reference = load_npz(runs["1x1"] / "rank0.npz")
    for rank in (0, 1):
        got = load_npz(runs["2x1"] / f"rank{rank}.npz")
        assert sorted(got) == sorted(reference)
        for name in reference:
            np.testing.assert_array_equal(got[name], reference[name], err_msg=f"rank {rank}: {name}")
    return reference


def test_importing_es_starts_no_backend_and_initialize_without_arguments_does_nothing():
    code = (
        "from jax._src import xla_bridge\n"
        "import es\n"
        "assert not xla_bridge.backends_are_initialized(), 'import es started a backend'\n"
        "group = es.distributed.initialize()\n"
        "assert group == es.distributed.ProcessGroup(0, 1, None, 'single process'), group\n"
        "assert es.distributed.is_writer() and es.distributed.process_count() == 1\n"
        "assert not xla_bridge.backends_are_initialized(), 'initialize() started a backend'\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_initialize_rejects_bad_configuration_before_touching_jax(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("ES_", "SLURM_", "OMPI_")):
            monkeypatch.delenv(name)
    with pytest.raises(ValueError, match="num_processes and process_id together"):
        es.distributed.initialize("127.0.0.1:1234")
    with pytest.raises(ValueError, match="host:port"):
        es.distributed.initialize("127.0.0.1", 2, 0)
    with pytest.raises(ValueError, match=r"process_id.*\[0, 2\)"):
        es.distributed.initialize("127.0.0.1:1234", 2, 2)
    with pytest.raises(ValueError, match="heartbeat_timeout"):
        es.distributed.initialize(heartbeat_timeout=0)
    with pytest.raises(TypeError, match="cluster_detection"):
        es.distributed.initialize(cluster_detection=None)
    # A valid multi-process request after JAX has started (as in this session) is refused clearly.
    with pytest.raises(RuntimeError, match="before any JAX computation"):
        es.distributed.initialize("127.0.0.1:1234", 2, 0)
    monkeypatch.setenv(es.distributed.ENV_NUM_PROCESSES, "2")
    with pytest.raises(ValueError, match="ES_COORDINATOR_ADDRESS"):
        es.distributed.initialize()


def test_slurm_is_detected_from_its_environment_and_one_task_is_a_plain_process(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("ES_", "SLURM_", "OMPI_")):
            monkeypatch.delenv(name)
    assert es.distributed.detected_cluster() is None
    slurm = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_NTASKS": "4",
             "SLURM_PROCID": "3", "SLURM_LOCALID": "1"}
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    assert es.distributed.detected_cluster() == ("slurm", 4)
    assert es.distributed.initialize(cluster_detection=False).num_processes == 1
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert es.distributed.initialize() == es.distributed.ProcessGroup(0, 1, None, "single process")


def test_the_split_update_runs_across_two_processes_bit_for_bit(tmp_path):
    """SNES (coordinatewise) on 8,800 params with exchange="sharded": each process's device updates its half of
    the coordinates and the halves cross processes; the result is one process's on one device, bit for bit."""
    strategy, hidden = "SNES", 1100
    assert es.engine.execution.splits_update(es.STRATEGIES[strategy](popsize=32, sigma=0.1), 8 * hidden, 2)
    worker = [WORKER, "--strategy", strategy, "--hidden", str(hidden), "--exchange", "sharded"]
    reference = two_processes_and_one(tmp_path, worker, "--report")
    assert "state/.strategy_state.sigma" in reference and reference["state/.params['w1']"].shape == (4, hidden)
    for rank in (0, 1):
        # What crossed: the fitnesses and, per generation, each device's slice of the mean and of sigma
        # (the update was split), not only the 32 fitnesses.
        info = json.loads((tmp_path / "2x1" / f"rank{rank}.json").read_text())
        assert info["report_ops"] == ["all-gather"] and info["report_total_bytes"] > 2 * 4 * 8 * hidden


def test_two_processes_of_two_devices_match_one_process_of_four_and_of_one_device_bit_for_bit(tmp_path):
    runs = {"2x2": tmp_path / "2x2", "1x4": tmp_path / "1x4", "1x1": tmp_path / "1x1"}
    for path in runs.values():
        path.mkdir()
    procs = {
        "2x2": subprocess.Popen(
            launcher("--processes", "2", "--devices-per-process", "2", "--timeout", str(CHILD_TIMEOUT),
                     "--", sys.executable, WORKER, str(runs["2x2"]), "--report", "--continue-locally"),
            env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        "1x4": subprocess.Popen([sys.executable, WORKER, str(runs["1x4"])], env=child_env(JAX_NUM_CPU_DEVICES="4"),
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        "1x1": subprocess.Popen([sys.executable, WORKER, str(runs["1x1"]), "--continue-locally"], env=child_env(JAX_NUM_CPU_DEVICES="1"),
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
    }
    outputs = {}
    for name, proc in procs.items():
        try:
            outputs[name] = proc.communicate(timeout=CHILD_TIMEOUT + 10)[0]
        except subprocess.TimeoutExpired:
            for p in procs.values():
                p.kill()
            pytest.fail(f"run {name} did not finish within {CHILD_TIMEOUT + 10} s")
        assert proc.returncode == 0, f"{name}:\n{outputs[name][-3000:]}"

    # Output lines carry their rank; both processes finished.
    lines = outputs["2x2"].splitlines()
    assert any(line.startswith("[rank 0] process 0 of 2 (es.launch)") for line in lines), outputs["2x2"][-2000:]
    assert any(line.startswith("[rank 1] process 1 of 2 (es.launch)") for line in lines), outputs["2x2"][-2000:]

    reference = load_npz(runs["1x1"] / "rank0.npz")
    assert {"state/.params['w1']", "state/.strategy_state.opt_state[0].mu", "metrics/fitness_mean"} <= set(reference)
    assert reference["metrics/fitness_mean"].shape == (4,) and int(reference["state/.generation"]) == 4
    assert int(reference["local_state/.generation"]) == 6
    local = {name for name in reference if name.startswith(("local_state/", "metrics/local_"))}
    assert len(local) > 10, "the 1x1 reference also continues with mesh=None"
    for result, expected_names in ((runs["1x4"] / "rank0.npz", set(reference) - local),
                                   (runs["2x2"] / "rank0.npz", set(reference)),
                                   (runs["2x2"] / "rank1.npz", set(reference))):
        got = load_npz(result)
        assert set(got) == expected_names
        for name in expected_names:  # bit for bit: exact equality
            np.testing.assert_array_equal(got[name], reference[name], err_msg=f"{result}: {name}", strict=True)

    infos = [json.loads((runs["2x2"] / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [i["is_writer"] for i in infos] == [True, False]
    for info in infos:
        assert info["num_processes"] == 2 and info["mesh_size"] == 4 and info["mesh_processes"] == [0, 1]
        assert info["params_replicated_on_mesh"] and info["local_state_on_this_process"]
        # Only the popsize=32 float32 fitnesses cross devices and processes: one all-gather over all 4.
        assert info["report_ops"] == ["all-gather"] and info["report_group_sizes"] == [4]
        assert info["report_total_bytes"] == 32 * 4
        assert "multiple of 2" in info["odd_mesh_error"]


def test_the_launcher_owns_the_stage_markers_a_rank_announces(tmp_path, monkeypatch):
    """es.run and es.distributed only announce stages; es.launch's hook turns them into its marker files."""
    monkeypatch.setenv(launch.ENV_LAUNCH_DIR, str(tmp_path))
    monkeypatch.setenv(es.distributed.ENV_PROCESS_ID, "1")
    assert launch.markers_written(str(tmp_path), es.distributed.STOPPABLE, 2) == set()
    es.distributed.announce(es.distributed.STOPPABLE)
    assert launch.markers_written(str(tmp_path), es.distributed.STOPPABLE, 2) == {1}
    monkeypatch.delenv(launch.ENV_LAUNCH_DIR)
    es.distributed.announce(es.distributed.CONNECTED)  # outside es.launch: nothing is written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stoppable.1"]


def test_launcher_passes_on_the_first_failure_and_stops_the_other_ranks():
    script = (
        "import os, sys, time\n"
        "rank = int(os.environ['ES_PROCESS_ID'])\n"
        "print('hello from', rank, 'of', os.environ['ES_NUM_PROCESSES'], flush=True)\n"
        "if rank == 1:\n"
        "    time.sleep(0.5); sys.exit(3)\n"
        "time.sleep(600)\n"
    )
    start = time.monotonic()
    proc = subprocess.run(launcher("--processes", "2", "--", sys.executable, "-c", script), env=child_env(),
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode == 3, proc.stderr
    assert "[rank 0] hello from 0 of 2" in proc.stdout and "[rank 1] hello from 1 of 2" in proc.stdout
    assert "rank 1" in proc.stderr and "exited with code 3" in proc.stderr
    assert elapsed < 20, f"launcher took {elapsed:.1f} s to stop rank 0"


def test_launcher_stops_polling_initialization_markers_once_every_rank_connected(tmp_path, monkeypatch):
    class Clock:  # one second per reading, no real sleeping
        now = 0.0

        @classmethod
        def monotonic(cls):
            cls.now += 1.0
            return cls.now

        sleep = staticmethod(lambda seconds: None)

    class Rank:  # runs for 50 polls (50 s), then exits 0
        polls = 0

        def poll(self):
            self.polls += 1
            return None if self.polls <= 50 else 0

    for stage in ("initializing", "connected"):
        for rank in (0, 1):
            (tmp_path / f"{stage}.{rank}").touch()
    reads = []
    markers = launch.markers_written
    monkeypatch.setattr(launch, "markers_written", lambda *a: reads.append(a[1]) or markers(*a))
    monkeypatch.setattr(launch, "time", Clock)
    args = launch.argparse.Namespace(processes=2, initialization_timeout=3, timeout=None, kill_grace=0.0)
    status = launch.supervise(args, [Rank(), Rank()], str(tmp_path), print, launch.Signals())
    assert status == 0
    # read every poll (second) until the initialization timeout (3 + 5 s) passes with every rank connected,
    # then never again
    assert reads.count("connected") == 1 and 8 <= reads.count("initializing") <= 10, reads


def test_killing_one_peer_ends_the_job_nonzero_within_the_bound():
    proc = subprocess.Popen(
        launcher("--processes", "2", "--devices-per-process", "1", "--timeout", str(CHILD_TIMEOUT),
                 "--", sys.executable, WORKER, "unused", "--forever"),
        env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids, evolving = {}, set()
    try:
        deadline = time.monotonic() + CHILD_TIMEOUT
        while len(evolving) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("[rank ") and "pid" in line:
                pids[int(line[6])] = int(line.split("pid ")[1].split(",")[0])
            if line.startswith("[rank ") and "evolving" in line:
                evolving.add(int(line[6]))
        assert len(evolving) == 2, "the two ranks did not start evolving"
        # Both ranks are now looping over evolve, exchanging fitnesses every generation.
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "rank 1" in err and "SIGKILL" in err, err[-2000:]
    # The bound: one poll interval plus the SIGTERM -> SIGKILL grace, plus process teardown.
    assert elapsed < KILL_GRACE + launch.POLL_SECONDS + 3.0, f"took {elapsed:.1f} s"


def test_a_peer_that_never_initializes_ends_the_job_within_the_initialization_timeout():
    timeout = 4
    start = time.monotonic()
    proc = subprocess.run(
        launcher("--processes", "2", "--initialization-timeout", str(timeout), "--timeout", str(CHILD_TIMEOUT),
                 "--", sys.executable, WORKER, "unused", "--sleep-before-initialize-on-rank", "1"),
        env=child_env(), cwd=REPO, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "[1] never reached es.distributed.initialize" in proc.stderr, proc.stderr[-2000:]
    # Rank 0 waits `timeout` s for rank 1, then the launcher stops both (python + jax import ~ a few s).
    assert elapsed < timeout + 5 + KILL_GRACE + 10, f"took {elapsed:.1f} s"


def test_processes_with_different_states_or_checkpoints_or_a_failing_writer_get_a_clear_error(tmp_path):
    script = (
        "import sys\n"
        "import es\n"
        "es.distributed.initialize()\n"
        "import jax, jax.numpy as jnp\n"
        "strategy = es.OpenES(popsize=8, sigma=0.1)\n"
        "f = lambda x, k: -jnp.sum(x * x)\n"
        "state = strategy.init(jax.random.key(0), jnp.ones(4) * jax.process_index())  # differs per process\n"
        "try:\n"
        "    es.evolve(strategy, f, state, 1, mesh=es.make_mesh())\n"
        "except ValueError as error:\n"
        "    print('refused:', error)\n"
        "state, run_dir = strategy.init(jax.random.key(0), jnp.ones(4)), sys.argv[1]\n"
        "kwargs = dict(segment=2, mesh=es.make_mesh(), progress=False)\n"
        "if jax.process_index() == 0:  # process 0 cannot open its checkpoints: a file is in the way\n"
        "    open(run_dir + '-file', 'w').close()\n"
        "try:\n"
        "    es.run(strategy, f, state, 2, run_dir=run_dir + '-file/run', **kwargs)\n"
        "except Exception as error:\n"
        "    print('failed:', type(error).__name__, error)\n"
        "es.run(strategy, f, state, 2, run_dir=run_dir, **kwargs)  # process 0 writes, generation 2\n"
        "mine = run_dir if jax.process_index() == 0 else run_dir + '-unshared'  # process 1 sees no checkpoint\n"
        "try:\n"
        "    es.run(strategy, f, state, 4, run_dir=mine, resume=True, **kwargs)\n"
        "except es.CheckpointError as error:\n"
        "    print('refused:', error)\n"
        "result = es.run(strategy, f, state, 4, run_dir=run_dir, resume=True, **kwargs)\n"
        "print('resumed to', int(result.state.generation), 'params', es.distributed.fetch(result.state.params))\n"
    )
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        launcher("--processes", "2", "--devices-per-process", "1", "--timeout", str(CHILD_TIMEOUT),
                 "--", sys.executable, "-c", script, str(run_dir)),
        env=child_env(), cwd=REPO, capture_output=True, text=True, timeout=CHILD_TIMEOUT + 10)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (f"[rank 0] failed: RunDirError cannot write {run_dir}-file/run/checkpoints: Not a directory."
            in proc.stdout), proc.stdout
    assert (f"[rank 1] failed: CheckpointError process 0 cannot start the run in {run_dir}-file/run: "
            "RunDirError: cannot write") in proc.stdout, proc.stdout
    resumed = {}
    for rank in (0, 1):
        assert f"[rank {rank}] refused: es.evolve: processes [1] hold a different state" in proc.stdout, proc.stdout
        assert (f"[rank {rank}] refused: the processes would start {run_dir}{'-unshared' if rank else ''} from "
                "different generations ([2, 0], in process order)") in proc.stdout, proc.stdout
        resumed[rank] = [line for line in proc.stdout.splitlines() if line.startswith(f"[rank {rank}] resumed to 4")]
        assert len(resumed[rank]) == 1, proc.stdout
    assert resumed[0][0][len("[rank 0]"):] == resumed[1][0][len("[rank 1]"):]  # the same params on both
    assert not (tmp_path / "run-unshared").exists(), "process 1 wrote"
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir()) == [2, 4]


STOP_SCRIPT = """
import os, signal, sys, time
rank, got = os.environ["ES_PROCESS_ID"], []
for signum in (signal.SIGTERM, signal.SIGINT):
    signal.signal(signum, lambda s, f: got.append(s))
if sys.argv[1] == "stoppable":  # the marker es.run leaves when it installs its handlers
    open(os.path.join(os.environ["ES_LAUNCH_DIR"], "stoppable." + rank), "w").close()
print("ready", flush=True)
while not got:
    time.sleep(0.01)
if sys.argv[1] == "ignores":  # as JAX's own SIGTERM handler does outside es.run
    time.sleep(600)
time.sleep(1.5)  # finishing a segment: longer than the kill grace
print("stopping after", [signal.Signals(s).name for s in got], flush=True)
sys.exit(128 + got[0])
"""


@pytest.mark.parametrize("rank_kind, signum", [("stoppable", signal.SIGINT), ("ignores", signal.SIGTERM)],
                         ids=["stoppable-SIGINT", "ignores-SIGTERM"])
def test_launcher_passes_a_stop_signal_on_once_and_waits_only_for_ranks_that_stop_cleanly(rank_kind, signum):
    grace = 0.5
    proc = subprocess.Popen(
        launcher("--processes", "2", "--kill-grace", str(grace), "--stop-timeout", "30", "--timeout", "60",
                 "--", sys.executable, "-c", STOP_SCRIPT, rank_kind),
        env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)  # its own process group, as a terminal job: Ctrl-C goes to the whole group
    try:
        ready = [proc.stdout.readline() for _ in range(2)]
        assert all(line.endswith("ready\n") for line in ready), ready
        start = time.monotonic()
        os.killpg(proc.pid, signum)  # what Ctrl-C (SIGINT) or a scheduler's kill of the job does
        out, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum, err
    assert f"received {signal.Signals(signum).name}; passing it on to rank(s) [0, 1]" in err, err
    if rank_kind == "stoppable":  # each rank got the signal exactly once, and the launcher waited for them
        for rank in (0, 1):
            assert f"[rank {rank}] stopping after ['{signal.Signals(signum).name}']" in out, out
        assert 1.5 < elapsed < 10, elapsed
        assert "SIGKILL to" not in err
    else:  # a rank outside es.run that ignores it is killed after the kill grace
        assert "still running after 0.5 s: SIGKILL to rank(s) [0, 1]" in err, err
        assert elapsed < grace + 3, elapsed


def test_cma_es_runs_across_two_processes_bit_for_bit(tmp_path):
    """es.CMAES (full covariance) as 2 processes x 1 device: every array of the state and the metrics equal a
    1-process 1-device run's, bit for bit (its covariance update is every device's own, from the fitnesses)."""
    worker = [WORKER, "--strategy", "CMAES", "--hidden", "4"]
    reference = two_processes_and_one(tmp_path, worker)
    assert reference["state/.strategy_state.cov"].shape == (32, 32)  # 8 * hidden params
