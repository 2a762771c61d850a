"""es.HostFitness: fitness in worker processes, its failures, and its independence from workers and devices.

Each test uses tiny problems (popsize 8, 3-5 parameters, a few generations) and
short timeouts; pools are closed at the end of every test.
"""

import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import es
from es.engine import members as population

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "workers"))
from host_run import GENERATIONS, INTERRUPTED, STRATEGY, host_problem, initial_state  # noqa: E402

from helpers import programs_built, wait_until_dead, xla_flags_without_device_count  # noqa: E402

CHILD_TIMEOUT = 150
QUICK_XLA_TIMEOUTS = ("--xla_cpu_collective_call_warn_stuck_timeout_seconds=1 "
                      "--xla_cpu_collective_call_terminate_timeout_seconds=1")
"""XLA's CPU collectives warn after 20 s and abort after 40 s of waiting: lowered to 1 s, where a test shows that
no device waits in one while the host evaluates."""


def child_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ES_")}
    env["XLA_FLAGS"] = xla_flags_without_device_count()
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def evolve_with(fn, generations=GENERATIONS, devices=1, shared_by=None, **options):
    """``es.evolve`` of ``STRATEGY`` with ``es.HostFitness(fn, **options)`` (under ``es.CommonRandomNumbers``
    where ``shared_by`` names who shares a seed) on ``devices`` devices."""
    with es.HostFitness(fn, **options) as fitness:
        fitness_fn = fitness if shared_by is None else es.CommonRandomNumbers(fitness, shared_by)
        return es.evolve(STRATEGY, fitness_fn, initial_state(), generations, mesh=es.make_mesh(devices))


# ------------------------------------------------------------------ results


def test_zero_generations_give_the_state_and_empty_metrics_of_the_generation_dtypes():
    state, metrics = evolve_with(host_problem, generations=0, devices=2, num_workers=1)
    assert int(state.generation) == 0 and set(metrics) == set(es.METRIC_NAMES)
    assert metrics["fitness_mean"].shape == (0,) and metrics["stop"].dtype == jnp.int32


@pytest.mark.slow
def test_fn_gets_numpy_params_of_each_member_and_the_seed_of_its_evaluation_key():
    def report(params, seed):
        assert isinstance(params["x"], np.ndarray) and params["x"].shape == (5,)
        return float(seed % 100_003)

    state, metrics = evolve_with(report, generations=1, num_workers=2)
    generation_key = population.generation_key(initial_state().key, jnp.int32(0))
    seeds = [int(es.host.member_seed(population.eval_key(generation_key, jnp.int32(i)))) for i in range(8)]
    expected = np.array([s % 100_003 for s in seeds], np.float32)
    assert float(metrics["fitness_max"][0]) == expected.max()
    assert float(metrics["fitness_mean"][0]) == pytest.approx(expected.mean(), rel=1e-6)


def test_a_stateful_host_fitness_folds_every_members_stats_into_the_state_in_member_order():
    """Each member reports what its state showed it and its own seed: the update gets every member's stats, on
    2 devices, in member order, and may keep them whole (a state with a popsize axis: checked before compiling
    with the population's size) - generation 1's seeds, as ``es.host.member_seed`` gives them."""
    fitness = es.HostFitness(
        lambda params, seed, fitness_state: (1.0, {"seen": np.float32(fitness_state["count"] + 1),
                                                  "seed": np.float32(seed % 100_003)}),
        num_workers=2,
        init=lambda: {"count": jnp.zeros((), jnp.float32), "seeds": jnp.zeros(8, jnp.float32)},
        update=lambda fitness_state, stats: {"count": fitness_state["count"] + jnp.sum(stats["seen"]),
                                             "seeds": stats["seed"]},
        stats={"seen": jax.ShapeDtypeStruct((), jnp.float32), "seed": jax.ShapeDtypeStruct((), jnp.float32)},
    )
    with fitness:
        state = STRATEGY.init(jax.random.key(0), {"x": jnp.zeros(3)}, fitness=fitness)
        key = state.key
        state, _ = es.evolve(STRATEGY, fitness, state, 2, mesh=es.make_mesh(2))
    # generation 0: 8 members report 0 + 1; generation 1: 8 members report 8 + 1.
    assert float(state.fitness_state["count"]) == 8 * 1 + 8 * 9
    generation_key = population.generation_key(key, jnp.int32(1))
    seeds = [int(es.host.member_seed(population.eval_key(generation_key, jnp.int32(i)))) % 100_003 for i in range(8)]
    assert len(set(seeds)) == 8
    np.testing.assert_array_equal(np.asarray(state.fitness_state["seeds"]), np.array(seeds, np.float32))


@pytest.mark.parametrize("shared_by", ["member", "pair", "generation"])
def test_a_host_generation_runs_no_collective_until_its_fitnesses_are_on_the_devices(shared_by):
    # The members program (run while nothing is evaluated; its seeds one per member, per pair or per generation,
    # as with es.CommonRandomNumbers) has no collective, as XLA compiled it; the update program takes the
    # fitnesses as its input, so it starts once the host has evaluated every member of every device.
    from es.engine import host_loop
    from es.parallel.global_arrays import replicate

    mesh = es.make_mesh(2)
    state = replicate(initial_state(), mesh)
    hp = STRATEGY.hyperparameters(5)
    members = host_loop._members_compiled.lower(STRATEGY.program(), shared_by, mesh, hp, state).compile().as_text()
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(es.POPULATION_AXIS))
    values = es.fitness.Fitnesses(*(jax.ShapeDtypeStruct((8,), jnp.float32, sharding=sharded),) * 2)
    update = host_loop._update_compiled.lower(STRATEGY.program(), None, mesh, es.engine.resolve_execution(
        STRATEGY, es.Layout.of(state.params), "fitness", None, None), hp, state, values, ()).as_text()
    collectives = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")  # HLO's names
    assert not [op for op in collectives if op in members]
    assert "all_gather" in update


@pytest.mark.slow
def test_devices_whose_shares_finish_seconds_apart_neither_abort_nor_print_xla_logs(tmp_path):
    """XLA's CPU collectives print "may be stuck" and abort the process (SIGABRT) when a device waits in one
    longer than their timeouts (20 s and 40 s): lowered to 1 s here, with one worker for a 2-device population of
    members that take 0.5 s each (where each device waited for its own share, they finished 2 s apart)."""
    flags = QUICK_XLA_TIMEOUTS
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "workers" / "host_run.py"), str(tmp_path), "--slow"],
                          env=child_env(JAX_NUM_CPU_DEVICES="2", XLA_FLAGS=flags), cwd=REPO, capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0 and "done 0 invalid" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not re.search(r"^[IWEF]\d{4} |rendezvous|stuck", proc.stderr, re.M), proc.stderr[-3000:]


# ------------------------------------------------------------------ failures


def test_fn_raising_is_a_fitness_error_naming_the_generation_member_and_traceback(tmp_path):
    flag = tmp_path / "fail"

    def fails_on_a_member(params, seed):
        if flag.exists() and params["x"][0] < -1.0:  # only perturbed members far enough left
            raise ValueError("the simulator diverged")
        return host_problem(params, seed)

    with es.HostFitness(fails_on_a_member, num_workers=2) as fitness:
        state, _ = es.evolve(STRATEGY, fitness, initial_state(), 1)
        flag.touch()
        with pytest.raises(es.FitnessError) as info:
            es.evolve(STRATEGY, fitness, state, 3)
    message = str(info.value)
    assert "generation 1, member" in message
    assert "ValueError: the simulator diverged" in message
    assert "Traceback in the worker process" in message and 'raise ValueError("the simulator diverged")' in message


def test_functions_pickled_by_value_get_their_source_file_back_for_worker_tracebacks():
    import functools

    import cloudpickle

    from es.host import pickled_code

    def helper(x):
        return sum(map(lambda v: v * 2, x))  # a nested code object

    def simulate(params, seed, scale):
        return helper(params) * scale

    fn = functools.partial(simulate, scale=3.0)
    files = pickled_code.source_files(fn)
    loaded = cloudpickle.loads(cloudpickle.dumps(fn))  # local functions always travel by value
    pickled_code.restore_source_files(loaded, files)

    restored_helper = loaded.func.__closure__[0].cell_contents  # simulate's one free variable: helper
    lambda_code = next(c for c in restored_helper.__code__.co_consts if hasattr(c, "co_filename"))
    assert {loaded.func.__code__.co_filename, restored_helper.__code__.co_filename, lambda_code.co_filename} == {__file__}
    assert loaded(np.array([1.0, 2.0]), 0) == 18.0


def test_a_callable_object_of_a_class_pickled_by_value_gets_its_methods_source_file_back():
    import cloudpickle

    from es.host import pickled_code

    class Simulator:  # a local class: cloudpickle sends it, and its methods, by value
        def __init__(self, scale):
            self.scale = scale

        def __call__(self, params, seed):
            return self.step(params) * self.scale

        def step(self, params):
            return float(np.sum(params))

        @staticmethod
        def unused():
            return 0

    fn = Simulator(2.0)
    files = pickled_code.source_files(fn)
    loaded = cloudpickle.loads(cloudpickle.dumps(fn))
    names = ("__init__", "__call__", "step")
    assert {getattr(type(loaded), name).__code__.co_filename for name in names} == {pickled_code.DYNAMIC_FILENAME}
    pickled_code.restore_source_files(loaded, files)
    assert {getattr(type(loaded), name).__code__.co_filename for name in names} == {__file__}
    assert type(loaded).unused.__code__.co_filename == __file__
    assert loaded(np.array([1.0, 2.0]), 0) == 6.0


@pytest.mark.parametrize("death", ["exit", "segfault"])
def test_a_worker_that_dies_is_a_fitness_error_and_leaves_no_process(tmp_path, death):
    def dies(params, seed):
        (tmp_path / str(os.getpid())).touch()
        if params["x"][0] > -1.0:  # the unperturbed-ish members live, some die
            return host_problem(params, seed)
        if death == "exit":
            os._exit(7)
        ctypes.string_at(0)  # SIGSEGV

    started = time.monotonic()
    with pytest.raises(es.FitnessError, match=r"generation 0, member \d+ .*died") as info:
        evolve_with(dies, num_workers=2)
    assert time.monotonic() - started < 60
    assert ("exit code 7" if death == "exit" else "killed by SIGSEGV") in str(info.value)
    pids = [int(p.name) for p in tmp_path.iterdir()]
    assert pids and not wait_until_dead(pids), "worker processes outlived the FitnessError"


def test_a_member_over_timeout_s_is_a_fitness_error_naming_it_and_stops_its_worker(tmp_path):
    def slow_member(params, seed):
        (tmp_path / str(os.getpid())).touch()
        if params["x"][0] < -1.0:
            time.sleep(120)
        return host_problem(params, seed)

    started = time.monotonic()
    with pytest.raises(es.FitnessError, match=r"generation 0, member \d+ \(seed \d+\) exceeded timeout_s=0.5"):
        evolve_with(slow_member, num_workers=2, timeout_s=0.5)
    assert time.monotonic() - started < 60
    assert not wait_until_dead([int(p.name) for p in tmp_path.iterdir()])


def test_a_fn_returning_something_else_than_a_number_is_a_fitness_error():
    with pytest.raises(es.FitnessError, match="must return one real number.*'oops'"):
        evolve_with(lambda params, seed: "oops", generations=1, num_workers=1)


def test_es_run_checkpoints_before_a_fitness_error_and_resumes_to_the_uninterrupted_result(tmp_path):
    flag = tmp_path / "fail"

    def flaky(params, seed):
        if flag.exists():
            raise RuntimeError("lost the connection to the instrument")
        return host_problem(params, seed)

    def fail_after_the_first_segment(segment):
        flag.touch()

    with es.HostFitness(flaky, num_workers=2) as fitness:
        with pytest.raises(es.FitnessError, match="lost the connection"):
            es.run(STRATEGY, fitness, initial_state(), 8, run_dir=tmp_path / "run", segment=2,
                   on_segment=fail_after_the_first_segment, progress=False)
        checkpoints = sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir())
        assert checkpoints and checkpoints[-1] >= 2
        flag.unlink()
        resumed = es.run(STRATEGY, fitness, initial_state(), 8, run_dir=tmp_path / "run", segment=2,
                         resume=True, progress=False)
        uninterrupted = es.run(STRATEGY, fitness, initial_state(), 8, segment=2, progress=False)
    np.testing.assert_array_equal(np.asarray(resumed.state.params["x"]), np.asarray(uninterrupted.state.params["x"]))


# ------------------------------------------------------------------ arguments


def test_bad_arguments_are_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="num_workers must be at least 1"):
        es.HostFitness(host_problem, num_workers=0)
    with pytest.raises(ValueError, match="timeout_s"):
        es.HostFitness(host_problem, timeout_s=-1.0)
    with pytest.raises(TypeError, match="fn must be callable"):
        es.HostFitness("not a function")
    with pytest.raises(TypeError, match=r"fn is called as fn\(params, seed\), but its signature is \(x\)"):
        es.HostFitness(lambda x: 0.0)
    with pytest.raises(TypeError, match=r"fn\(params, seed, fitness_state\), but its signature is \(params, seed\)"):
        es.HostFitness(lambda params, seed: 0.0, init=lambda: {"n": jnp.zeros(())}, update=lambda f, s: f, stats=())
    with pytest.raises(TypeError, match="init, update and stats together; also pass update, stats"):
        es.HostFitness(host_problem, init=lambda: ())
    lock = __import__("threading").Lock()
    with pytest.raises(TypeError, match="cannot be sent to worker processes"):
        es.HostFitness(lambda params, seed: float(lock.locked()))
    assert es.HostFitness(host_problem).num_workers == len(os.sched_getaffinity(0))


def test_a_stateless_state_with_a_stateful_host_fitness_is_refused():
    fitness = es.HostFitness(lambda p, s, f: (0.0, ()), init=lambda: {"n": jnp.zeros(())},
                             update=lambda f, s: f, stats=())
    with pytest.raises(ValueError, match="stateful .* state.fitness_state is None"):
        es.evolve(STRATEGY, fitness, initial_state(), 1)


def test_an_update_that_breaks_the_state_is_refused_before_compiling():
    """``update`` is checked on the stats of the strategy's popsize (8), gathered: a state of another shape, or an
    update that is not JAX code, is a TypeError naming it."""
    stats = {"seen": jax.ShapeDtypeStruct((), jnp.float32)}
    init = lambda: {"n": jnp.zeros(())}  # noqa: E731
    for update, message in ((lambda f, s: {"n": s["seen"][:4]}, r"must return a state like init\(\)'s"),
                            (lambda f, s: {"n": float(s["seen"][0])}, "failed on the fitness state and the stats")):
        fitness = es.HostFitness(lambda p, seed, f: (0.0, {"seen": np.float32(0)}), init=init, update=update,
                                 stats=stats)
        state = STRATEGY.init(jax.random.key(0), {"x": jnp.zeros(3)}, fitness=fitness)
        with programs_built() as built, pytest.raises(TypeError, match=message):
            es.evolve(STRATEGY, fitness, state, 1)
        assert not [name for name in built if "_compiled" in name]


# ------------------------------------------------------------------ processes


def start_hanging_run(tmp_path):
    """A run whose 2 workers are both busy in a long fn: ``(child, worker pids)``.

    The child dumps every thread's stack to stderr on SIGABRT (``PYTHONFAULTHANDLER``), for failure messages.
    """
    child = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "workers" / "host_run.py"), str(tmp_path), "--hang"],
        env=child_env(PYTHONFAULTHANDLER="1"), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    pid_dir = tmp_path / "pids"
    deadline = time.monotonic() + CHILD_TIMEOUT
    while time.monotonic() < deadline and len(list(pid_dir.glob("*")) if pid_dir.exists() else []) < 2:
        if child.poll() is not None:
            raise AssertionError(child.communicate())
        time.sleep(0.1)
    workers = [int(p.name) for p in pid_dir.iterdir()]
    assert len(workers) == 2, "both workers should be busy"
    return child, workers


@pytest.mark.slow
def test_sigint_stops_the_workers_and_raises_keyboard_interrupt(tmp_path):
    """One Ctrl-C while both workers hang in fn: KeyboardInterrupt reaches the script within seconds
    (stopping the pool may take up to es.host.STOP_TIMEOUT_S) and the workers are gone. The process exit
    that follows is JAX's native teardown (measured: 0.1 s from Ctrl-C to the script, then 4-7 s of
    teardown on this 2-core machine under load, deaf to further SIGINTs), so it only gets a generous bound
    that still catches a hang."""
    child, workers = start_hanging_run(tmp_path)
    lines, errors = [], []
    readers = [threading.Thread(target=lambda: lines.extend(child.stdout), daemon=True),
               threading.Thread(target=lambda: errors.extend(child.stderr), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        child.send_signal(signal.SIGINT)
        bound = es.host.STOP_TIMEOUT_S + 10.0
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline and not any(INTERRUPTED in line for line in lines):
            time.sleep(0.05)
        if not any(INTERRUPTED in line for line in lines):
            child.send_signal(signal.SIGABRT)  # where is it? (every thread's stack, on stderr)
            child.wait(timeout=30)
            time.sleep(1)
            stacks = "".join(errors)[-6000:]
            raise AssertionError(f"no KeyboardInterrupt within {bound:.0f} s of Ctrl-C: {lines}\n{stacks}")
        assert not wait_until_dead(workers), "workers outlived Ctrl-C"
        child.wait(timeout=120)
        for reader in readers:
            reader.join(timeout=10)
    finally:
        child.kill()
    stderr = "".join(errors)
    assert child.returncode != 0 and "KeyboardInterrupt" in stderr, stderr[-2000:]


@pytest.mark.slow
def test_a_first_sigint_inside_es_run_finishes_the_segment_checkpoints_and_stops_the_workers(tmp_path):
    child = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "workers" / "host_run.py"), str(tmp_path), "--run"],
        env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        checkpoints = tmp_path / "run" / "checkpoints"
        deadline = time.monotonic() + CHILD_TIMEOUT
        while time.monotonic() < deadline and not any(p.name.isdigit() for p in
                                                      (checkpoints.iterdir() if checkpoints.exists() else [])):
            if child.poll() is not None:
                raise AssertionError(child.communicate())
            time.sleep(0.1)
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, stderr[-2000:]
    stopped = [line for line in stdout.splitlines() if line.startswith("stopped_by")]
    assert stopped and stopped[0].startswith(f"stopped_by {int(signal.SIGINT)} at generation"), stdout
    generation = int(stopped[0].split()[-1])
    assert generation < 200 and (checkpoints / str(generation)).is_dir()
    assert not wait_until_dead([int(p.name) for p in (tmp_path / "pids").iterdir()])


@pytest.mark.slow
def test_workers_busy_in_fn_do_not_outlive_a_killed_process(tmp_path):
    child, workers = start_hanging_run(tmp_path)
    child.kill()  # SIGKILL: no Python cleanup at all
    child.wait(timeout=30)
    assert not wait_until_dead(workers), "workers outlived their SIGKILLed process"


@pytest.mark.slow
@pytest.mark.parametrize("slow", [False, True], ids=["even", "one-process-2s-behind"])
def test_each_process_of_a_launch_evaluates_its_members_and_matches_one_process(tmp_path, slow):
    """With ``slow``, process 1's members take 1 s each (its share ends about 2 s after process 0's, every
    generation), under XLA's collective timeouts lowered to 1 s: no process waits in a collective meanwhile, so
    neither aborts nor prints XLA's log lines."""
    flags = {"XLA_FLAGS": f"{xla_flags_without_device_count()} {QUICK_XLA_TIMEOUTS}"} if slow else {}
    proc = subprocess.run(
        [sys.executable, "-m", "es.launch", "--processes", "2", "--devices-per-process", "2", "--",
         sys.executable, str(REPO / "tests" / "workers" / "host_run.py"), str(tmp_path),
         *(["--slow-on-rank", "1"] if slow else [])],
        env=child_env(**flags), cwd=REPO, capture_output=True, text=True, timeout=CHILD_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not re.search(r"^(\[rank \d\] )?[IWEF]\d{4} |rendezvous|stuck", proc.stdout + proc.stderr, re.M), \
        proc.stdout[-3000:] + proc.stderr[-3000:]
    reference, _ = evolve_with(host_problem, devices=1, num_workers=1)
    for rank in (0, 1):
        with np.load(tmp_path / f"rank{rank}.npz") as got:
            np.testing.assert_array_equal(got["x"], np.asarray(reference.params["x"]))


@pytest.mark.slow
def test_a_failure_on_one_process_of_a_launch_raises_on_every_process(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "es.launch", "--processes", "2", "--devices-per-process", "1", "--",
         sys.executable, str(REPO / "tests" / "workers" / "host_run.py"), str(tmp_path), "--fail-on-rank", "1"],
        env=child_env(), cwd=REPO, capture_output=True, text=True, timeout=CHILD_TIMEOUT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-3000:]
    for rank in (0, 1):
        assert f"[rank {rank}] FitnessError: process 1: es.HostFitness: fn raised in generation 0" in out, out[-3000:]
