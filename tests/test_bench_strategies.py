"""The strategies benchmark: its verdicts say what they claim, and one tiny cell runs end to end."""

import math

import numpy as np
import pytest

import tasks
from experiments.bench import strategies


def test_no_worse_means_within_the_relative_and_absolute_tolerances():
    rel, tol = strategies.REL_TOL, strategies.ABS_TOL
    assert strategies.verdict(1.0, 1.0) == "tie"
    assert strategies.verdict(1.0 + rel * 0.99, 1.0) == "tie"  # worse, but within the relative tolerance
    assert strategies.verdict(1.0 + rel * 1.01 + tol, 1.0) == "loss"
    assert strategies.verdict(0.5, 1.0) == "better"
    assert strategies.verdict(tol / 2, 0.0) == "tie"  # both solved: gaps below the absolute tolerance
    assert strategies.verdict(math.inf, 1.0) == "loss" and strategies.verdict(1.0, math.inf) == "better"
    counts = strategies.score([{"verdict": v} for v in ("better", "tie", "tie", "loss")])
    assert (counts["better"], counts["tie"], counts["loss"], counts["no_worse"]) == (1, 2, 1, 0.75)


def test_gap_is_the_float64_distance_to_the_optimum_and_infinite_when_diverged():
    task = tasks.make("styblinski_tang", dim=1000)
    assert abs(strategies.gap(task, task.optimum())) < 1e-6  # float32 evaluation would be off by ~2e-2
    assert strategies.gap(task, np.full(1000, np.nan, np.float32)) == math.inf


@pytest.mark.slow
def test_a_tiny_cell_runs_both_libraries_and_renders_a_report():
    pytest.importorskip("evosax", reason="the baseline library is the bench extra: pip install -e '.[bench]'")
    cell = strategies.Cell("SNES", "sphere", dim=3, popsize=8, generations=2, sigma=1.0)
    result = strategies.run_cell(cell, seeds=2)
    for library in ("es", "evosax"):
        assert len(result[library]["gaps"]) == 2 and all(math.isfinite(g) for g in result[library]["gaps"])
        assert result[library]["s_per_gen"] > 0
    for library in ("es", "evosax"):
        assert result[library]["median_gap"] == float(np.median(result[library]["gaps"]))
    assert result["verdict"] == strategies.verdict(result["es"]["median_gap"], result["evosax"]["median_gap"])
    report = strategies.report({"machine": "test", "seconds": 1.0, "popsize": {3: 8}, "generations": {3: 2},
                                "seeds": 2, "cells": [result], "speed": []})
    assert "| sphere |" in report and "SNES / SNES" in report and "target >= 80%" in report


def test_a_report_of_speed_cells_alone_has_no_quality_sections():
    """``--no-quality``: the speed table, and neither the score nor a quality table of no cells."""
    speed = {"strategy": "SNES", "params": 1_000_000, "popsize": 1024, "generations": 3, "rounds": 3,
             "es_s_per_gen": 0.01, "evosax_s_per_gen": 0.02, "speedup": 2.0}
    report = strategies.report({"machine": "test", "seconds": 60.0, "popsize": {}, "generations": {}, "seeds": 5,
                                "cells": [], "speed": [speed]})
    assert "| SNES | 1,000,000 | 1,024 | 0.01 | 0.02 | 2.00x | yes |" in report
    assert "Score" not in report and "dimensions" not in report and "seeds per cell" not in report
