"""The benchmark suite reports every outcome as a row (never crashes): pure helpers, and tiny child commands."""

import sys

from experiments.bench import suite


def record(status="ready", seconds=(2.0, 1.0, 3.0), generations=2, **extra):
    return {"status": status, "seconds": list(seconds), "generations": generations, **extra}


def test_summary_is_the_median_per_generation_and_throughput():
    summary = suite.summarise(record(), dim=1000, popsize=10)
    assert summary["status"] == "ok"
    assert summary["s_per_gen"] == 1.0  # median 2.0 s over 2 generations
    assert summary["throughput"] == 10_000.0


def test_out_of_memory_rows_are_reported_not_raised():
    ok = suite.summarise(record(), dim=1000, popsize=10)
    predicted = suite.summarise({"status": "oom-predicted", "xla_bytes": 2**40}, dim=1000, popsize=10)
    crashed = suite.summarise({"status": "oom", "error": "worker exited with -9"}, dim=1000, popsize=10)
    assert predicted["status"] == "OOM (predicted)" and crashed["status"] == "OOM"
    assert suite.ratio(ok, predicted) == "(OOM (predicted))"
    assert suite.ratio(crashed, ok) == "-"
    row = {"problem": "sphere", "params": 1000, "popsize": 10, "generations": 2,
           "summary": {"es PRNG": ok, "es table": crashed, "evosax": predicted}}
    table = suite.comparison_table([row])
    assert "| OOM |" in table and "OOM (predicted)" in table and "1,000" in table


def test_generations_per_call_follow_the_work_target_within_bounds():
    assert suite.generations_for(1_000_000, 1024, 3e8) == 1
    assert suite.generations_for(100_000, 1024, 3e8) == 3
    assert suite.generations_for(10, 2, 3e8) == 200


def test_child_commands_give_their_last_json_line_or_an_error_for_timeouts_and_failures():
    from experiments.bench.common import run_command

    python = [sys.executable, "-c"]
    chatty = "print('{\"a\": 1}'); print('log'); print('[rank 0] {\"a\": 2}'); print('{\"a\": 3}'); print('done')"
    assert run_command([*python, chatty], timeout=60) == {"a": 3}
    assert run_command([*python, chatty], timeout=60, prefix="[rank 0] ") == {"a": 2}
    failed = run_command([*python, "import sys; print('{}'); sys.exit('broken: 3')"], timeout=60)
    assert failed["error"].startswith("exit 1: ") and "broken: 3" in failed["error"]
    assert "no JSON result" in run_command([*python, "print('no json')"], timeout=60)["error"]
    assert run_command([*python, "import time; time.sleep(30)"], timeout=0.5) == {"error": "timed out after 0 s"}
