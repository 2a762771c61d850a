"""Run the test suite as one pytest process per test file (or group of light files), ``--jobs`` at a time.

    python tests/run_files.py                 # every tests/test_*.py, 2 at a time
    python tests/run_files.py --jobs 1 tests/test_engine.py tests/test_runs.py
    python tests/run_files.py -m "not slow"   # the fast tier (make test-fast)

Why one process per file: in a single process for the whole suite, XLA's CPU
compiler crashed (SIGSEGV/SIGABRT inside ``backend_compile``) after a few
hundred earlier compilations, while every file passes alone. Why two at a
time: two files keep a 2-core machine 94% busy (XLA compiles a program on up to
two threads); three took more CPU and more time (docs/benchmarks.md). The slowest files start first (``START_FIRST``) so
the two workers finish together. The lightest files (a few seconds and programs each) share one process per
group of ``TOGETHER``, which saves each the start of Python, JAX and pytest (1.5-2.5 s). Each process's
output is printed whole when it finishes; a file that runs past ``--timeout`` seconds is killed (with its
child processes) and counted as failed, so a hang can never stall CI. The exit
status is 0 only if every file passed. ``-m EXPR`` selects tests by marker as pytest does (a file whose
tests are all deselected counts as passed).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# The slowest files, slowest first: measured by this runner on a fresh clone, 2 cores, 2 at a time.
START_FIRST = (  # 2026-11-28, 2 at a time; a file of a TOGETHER group places its group
    "test_invariance.py",  # 191 s
    "test_distributed.py",  # 114 s
    "test_docs.py",  # 100 s
    "test_train_cli.py",  # 86 s
    "test_sweep.py",  # 84 s
    "test_strategies.py",  # 79 s
    "test_sharded.py",  # 75 s
    "test_tasks_envs.py",  # 64 s
    "test_docs_guides.py",  # 61 s
    "test_tasks_gym.py",  # its group: 56 s
    "test_host.py",  # 44 s
    "test_noise.py",  # 43 s
    "test_validation.py",  # its group: 43 s
    "test_strategy_references.py",  # 40 s
    "test_docs_concepts.py",  # 37 s
    "test_lowrank.py",  # 35 s
)
TOGETHER = (  # light files, one process per group; the others (and any file not named here) run alone
    ("test_bench_ask_tell.py", "test_bench_coco.py", "test_bench_coco_suites.py", "test_bench_scaling.py",
     "test_bench_strategies.py", "test_bench_suite.py", "test_bench_suite_compiles.py", "test_bench_unroll.py",
     "test_packaging.py"),
    ("test_collectives.py", "test_compat.py", "test_config.py", "test_gymnasium_results.py", "test_shaping.py",
     "test_tasks_defaults.py", "test_validation.py", "test_openes_reference.py", "test_tasks_functions.py",
     "test_train_sweep.py"),
    ("test_common_random_numbers.py", "test_run_files.py", "test_strategy_maths.py", "test_tasks_gym.py"),
)
DEFAULT_TIMEOUT_S = 900
CACHE = TESTS.parent / ".cache" / "jax"
"""The tests' compilation cache (tests/conftest.py), unless ``$ES_COMPILATION_CACHE`` names another."""
CACHE_MAX_BYTES = 2**31
"""The tests' cache is trimmed to this before the files start, the least recently written files first (the test
processes write it without JAX's size limit, which rescans the directory at every write)."""


def trim_cache(directory: Path, max_bytes: int = CACHE_MAX_BYTES) -> int:
    """Remove the least recently written files under ``directory`` until it holds at most ``max_bytes``; the
    number removed."""
    files = []
    for path in directory.rglob("*") if directory.is_dir() else ():
        try:
            if path.is_file():
                info = path.stat()
                files.append((info.st_mtime, info.st_size, path))
        except OSError:  # gone meanwhile
            pass
    total, removed = sum(size for _, size, _ in files), 0
    for _, size, path in sorted(files):
        if total <= max_bytes:
            break
        path.unlink(missing_ok=True)
        total, removed = total - size, removed + 1
    return removed


def ordered(files: list[Path]) -> list[tuple[Path, ...]]:
    """``files`` as the units that run in one process each (a ``TOGETHER`` group that holds any of them is one
    unit): the units with a file in ``START_FIRST`` first, in its order, then the rest in name order."""
    rank = {name: i for i, name in enumerate(START_FIRST)}
    group_of = {name: i for i, group in enumerate(TOGETHER) for name in group}
    units: dict[object, list[Path]] = {}
    for f in sorted(files, key=lambda f: f.name):
        units.setdefault(("group", group_of[f.name]) if f.name in group_of else f, []).append(f)
    return sorted((tuple(unit) for unit in units.values()),
                  key=lambda unit: (min(rank.get(f.name, len(rank)) for f in unit), unit[0].name))


def label(unit: tuple[Path, ...]) -> str:
    return " ".join(os.path.relpath(f) for f in unit)


NOTHING_SELECTED = 5  # pytest's exit status when a file has no test that the marker expression selects


def start(unit: tuple[Path, ...], log_dir: Path, marker: str | None = None) -> tuple[subprocess.Popen, Path, float]:
    log = log_dir / f"{unit[0].stem}.log"
    selection = ["-m", marker] if marker else []
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=5", *selection, *map(str, unit)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,  # its own group: killed whole
        )
    return process, log, time.monotonic()


def kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def run(files: list[Path], jobs: int, timeout_s: float, log_dir: Path, marker: str | None = None) -> int:
    pending, running, results = ordered(files), {}, {}
    try:
        while pending or running:
            while pending and len(running) < jobs:
                unit = pending.pop(0)
                running[unit] = start(unit, log_dir, marker)
            time.sleep(0.2)
            for unit, (process, log, began) in list(running.items()):
                elapsed = time.monotonic() - began
                if process.poll() is None and elapsed <= timeout_s:
                    continue
                timed_out = process.poll() is None
                if timed_out:
                    kill_group(process)
                del running[unit]
                ok = not timed_out and (process.returncode == 0
                                        or (marker is not None and process.returncode == NOTHING_SELECTED))
                results[unit] = (ok, elapsed)
                verdict = "passed" if ok else f"TIMED OUT after {timeout_s:.0f} s" if timed_out else "FAILED"
                print(f"==== {label(unit)}: {verdict} in {elapsed:.0f} s", flush=True)
                print(log.read_text(errors="replace").rstrip(), flush=True)
    except KeyboardInterrupt:
        for process, _, _ in running.values():
            kill_group(process)
        raise
    print("\n==== durations (s), slowest first")
    for unit, (ok, elapsed) in sorted(results.items(), key=lambda item: -item[1][1]):
        print(f"{elapsed:7.0f}  {'ok  ' if ok else 'FAIL'}  {label(unit)}")
    failed = [label(unit) for unit, (ok, _) in results.items() if not ok]
    print(f"failed: {' '.join(failed)}" if failed else f"all {sum(map(len, results))} test files passed")
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="default: every tests/test_*.py")
    parser.add_argument("--jobs", type=int, default=2, help="test files run at once (default 2)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per file")
    parser.add_argument("--log-dir", type=Path, default=None, help="default: a fresh temporary folder")
    parser.add_argument("-m", dest="marker", default=None, metavar="EXPR",
                        help='run only the tests this marker expression selects, e.g. "not slow"')
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give at least 1")
    files = [f.resolve() for f in args.files] or sorted(TESTS.glob("test_*.py"))
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        parser.error(f"no such test file: {' '.join(missing)}")
    if args.log_dir is None:
        import tempfile

        args.log_dir = Path(tempfile.mkdtemp(prefix="es-tests-"))
    args.log_dir.mkdir(parents=True, exist_ok=True)
    trim_cache(Path(os.environ.get("ES_COMPILATION_CACHE") or CACHE))
    return run(files, args.jobs, args.timeout, args.log_dir, args.marker)


if __name__ == "__main__":
    sys.exit(main())
