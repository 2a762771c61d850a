"""Where the test suite's time goes: XLA compilations per program and per test, recorded in every test process.

    python -m experiments.bench.suite_compiles                     # the whole suite, as make test runs it
    python -m experiments.bench.suite_compiles tests/test_engine.py --out /tmp/engine_compiles.json

Runs ``tests/run_files.py`` (``--jobs`` files at a time, as ``make test`` does) with this module loaded as a
pytest plugin in each test process (``PYTEST_ADDOPTS=-p experiments.bench.suite_compiles``). The plugin
registers a ``jax.monitoring`` listener that writes one JSON line per event to ``SUITE_COMPILES_DIR``: each
tracing, lowering and XLA compilation (its seconds, the jitted function's name and the test that was
running) and each test's own duration. Reported: seconds and counts per program name, per test file and per
test. Compilations in the child processes a test starts (workers, ``es.launch`` ranks, CLI runs) are not seen.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

from experiments.bench.common import markdown_table, write_results

RESULTS = os.path.join(os.path.dirname(__file__), "results")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EVENTS = {  # jax.monitoring's duration events, by the last part of their name
    "backend_compile_duration": "compile",
    "jaxpr_trace_duration": "trace",
    "jaxpr_to_mlir_module_duration": "lower",
}

# ---------------------------------------------------------------- the plugin (in each test process)

_current_test = ["(collection)"]
_out = []


def _write(row: dict) -> None:
    if not _out:
        directory = os.environ["SUITE_COMPILES_DIR"]
        _out.append(open(os.path.join(directory, f"{os.getpid()}.jsonl"), "a"))
    _out[0].write(json.dumps(row) + "\n")


def _listener(event: str, duration: float, **kwargs) -> None:
    kind = EVENTS.get(event.rsplit("/", 1)[-1])
    if kind:
        _write({"test": _current_test[0], "kind": kind, "s": duration, "fun": str(kwargs.get("fun_name", ""))})


def pytest_configure(config) -> None:
    if "SUITE_COMPILES_DIR" in os.environ:
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(_listener)


def pytest_runtest_setup(item) -> None:
    _current_test[0] = item.nodeid


def pytest_runtest_logreport(report) -> None:
    if report.when == "call" and "SUITE_COMPILES_DIR" in os.environ:
        _write({"test": report.nodeid, "kind": "test", "s": report.duration, "fun": ""})
        _out[0].flush()


# ---------------------------------------------------------------- the report


def read_rows(directory: str) -> list[dict]:
    rows = []
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def summarise(rows: list[dict], top: int = 25) -> dict:
    """Totals per kind, and the ``top`` programs (by compile seconds), files and tests (by test seconds)."""
    totals = collections.defaultdict(lambda: [0, 0.0])
    programs = collections.defaultdict(lambda: [0, 0.0])
    files = collections.defaultdict(lambda: [0.0, 0.0])  # test seconds, trace + lower + compile seconds
    tests = collections.defaultdict(lambda: [0.0, 0, 0.0])  # test seconds, compilations, their seconds
    for row in rows:
        totals[row["kind"]][0] += 1
        totals[row["kind"]][1] += row["s"]
        file = row["test"].split("::")[0]
        if row["kind"] == "test":
            files[file][0] += row["s"]
            tests[row["test"]][0] += row["s"]
            continue
        files[file][1] += row["s"]
        if row["kind"] == "compile":
            programs[row["fun"]][0] += 1
            programs[row["fun"]][1] += row["s"]
            tests[row["test"]][1] += 1
            tests[row["test"]][2] += row["s"]
    by = lambda table, i: sorted(table.items(), key=lambda item: -item[1][i])[:top]  # noqa: E731
    return {
        "totals": {kind: {"count": n, "s": s} for kind, (n, s) in totals.items()},
        "programs": [{"program": name, "compilations": n, "s": s} for name, (n, s) in by(programs, 1)],
        "files": [{"file": name, "test_s": t, "jax_s": j} for name, (t, j) in by(files, 0)],
        "tests": [{"test": name, "test_s": t, "compilations": n, "compile_s": c} for name, (t, n, c) in by(tests, 0)],
    }


def report_text(summary: dict) -> str:
    totals = summary["totals"]
    lines = ["| what | count | seconds |", "|---|---|---|"]
    lines += [f"| {kind} | {totals[kind]['count']} | {totals[kind]['s']:.0f} |"
              for kind in ("test", "trace", "lower", "compile") if kind in totals]
    sections = [
        "\n".join(lines),
        markdown_table(["program (jitted function)", "compilations", "compile s"],
                       [[p["program"], p["compilations"], f"{p['s']:.1f}"] for p in summary["programs"]]),
        markdown_table(["test file", "test s", "trace + lower + compile s"],
                       [[f["file"], f"{f['test_s']:.0f}", f"{f['jax_s']:.0f}"] for f in summary["files"]]),
        markdown_table(["test", "test s", "compilations", "compile s"],
                       [[t["test"], f"{t['test_s']:.1f}", t["compilations"], f"{t['compile_s']:.1f}"]
                        for t in summary["tests"]]),
    ]
    return "\n\n".join(sections)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", help="test files (default: every tests/test_*.py)")
    parser.add_argument("--jobs", type=int, default=2, help="test files at a time (default 2, as make test)")
    parser.add_argument("--top", type=int, default=25, help="rows per table (default 25)")
    parser.add_argument("--out", default=os.path.join(RESULTS, "suite_compiles.json"))
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give at least 1")
    if args.top < 1:
        parser.error(f"--top {args.top}: give at least 1")
    directory = tempfile.mkdtemp(prefix="suite-compiles-")
    env = {**os.environ, "SUITE_COMPILES_DIR": directory,
           "PYTEST_ADDOPTS": (os.environ.get("PYTEST_ADDOPTS", "") + " -p experiments.bench.suite_compiles").strip(),
           "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    status = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "run_files.py"), "--jobs", str(args.jobs),
                             *args.files], env=env, cwd=ROOT).returncode
    wall = time.perf_counter() - start
    summary = summarise(read_rows(directory), args.top)
    text = f"{wall:.0f} s wall, {args.jobs} files at a time, tests {'passed' if status == 0 else 'FAILED'}\n\n"
    write_results(args.out, [], text + report_text(summary), {**summary, "wall_s": wall, "jobs": args.jobs,
                                                             "tests_passed": status == 0})
    return status


if __name__ == "__main__":
    sys.exit(main())
