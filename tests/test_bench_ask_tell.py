"""The ask/tell overhead benchmark: every runner runs its generations, and es rows get their pycma ratio."""

import pytest

from experiments.bench import ask_tell


@pytest.mark.slow
def test_a_tiny_measurement_times_every_runner_and_compares_es_with_pycma():
    pytest.importorskip("cma", reason="pycma, the baseline: pip install -e '.[bench]'")
    runners = [r for r in ask_tell.RUNNERS if r[0] in ("es.SepCMAES float32", "pycma sep-CMA-ES")]
    rows = ask_tell.with_ratios(ask_tell.measure(dim=3, popsize=4, rounds=2, generations=3, warmup=1,
                                                 runners=runners, log=lambda *_: None))
    es_row, pycma_row = rows
    assert es_row["generations"] == pycma_row["generations"] == 6
    for row in rows:
        assert 0 < row["ask_ms"] and 0 < row["tell_ms"] and row["gen_ms"] >= max(row["ask_ms"], row["tell_ms"]) / 2
        assert row["cpu_ms"] >= 0
    assert es_row["baseline"] == "pycma sep-CMA-ES" and es_row["ratio"] == es_row["gen_ms"] / pycma_row["gen_ms"]
    assert es_row["first_gen_compiles"] >= 1 and es_row["restart_compiles"] >= 1  # a new popsize compiles
    assert "restart_s" not in pycma_row and "ratio" not in pycma_row
    text = ask_tell.table(rows)
    assert text.startswith("| runner | ask ms | tell ms | generation ms | vs pycma |")
    assert "x pycma sep-CMA-ES |" in text


def test_the_runners_keep_running_across_their_resets():
    pytest.importorskip("cma", reason="pycma, the baseline: pip install -e '.[bench]'")
    for runner in (ask_tell.EsRunner("SepCMAES", 3, 4, x64=False), ask_tell.LoopRunner(3, 4),
                   ask_tell.PycmaRunner("full", 3, 4)):
        ask_tell.run_block(runner, ask_tell.RESET_EVERY + 2)
        assert runner.generation_count == 2
