"""experiments/bench/coco.py --suite: each of COCO's suites reaches each solver with its option, and "solved"
reads COCO's own indicator (noise-free, or with the violations) where the measured value is not it."""

import json
import types

import numpy as np
import pytest

from experiments.bench import coco, coco_suites

cocoex = pytest.importorskip("cocoex", reason="COCO's suites: pip install -e '.[bench]'")
pytest.importorskip("cma", reason="pycma, the baseline: pip install -e '.[bench]'")
SUITES = ("bbob-boxed", "bbob-constrained", "bbob-mixint", "bbob-noisy")


def tiny_sweep(tmp_path, suite, solvers, budget_multiplier=50):
    dim = 5 if suite == "bbob-mixint" else 2
    return coco.sweep([dim], [1, 2], [1], solvers, budget_multiplier, str(tmp_path / "coco"), "t", 1, "zero",
                      str(tmp_path / f"{suite}.json"), log=lambda *_: None, suite=suite)


@pytest.mark.parametrize("suite", SUITES)
def test_each_suite_gives_es_its_option_and_pycma_its_own(tmp_path, monkeypatch, suite):
    """A stand-in es.minimize takes the es side's call; pycma runs for real with its option."""
    import es

    calls = []

    def minimize(fun, x0, sigma0, *, max_evals, target=None, restarts=None, seed=0, **options):
        calls.append(options)
        best = min(fun(np.asarray(x0, np.float64)) for _ in range(3))
        return types.SimpleNamespace(restarts=(), stop="max_evals", nfev=3, fun=best)

    monkeypatch.setattr(es, "minimize", minimize)
    result = tiny_sweep(tmp_path, suite, ["es", "pycma"])
    expected = {"bbob-boxed": {"bounds"}, "bbob-constrained": {"constraints"},
                "bbob-mixint": {"bounds", "integer_variables"}, "bbob-noisy": {"noisy"}}[suite]
    assert [set(c) for c in calls] == [expected, expected]
    if suite == "bbob-mixint":
        assert calls[0]["integer_variables"] == [0, 1, 2, 3]  # 5-D: four integer variables, one continuous
        np.testing.assert_array_equal(calls[0]["bounds"][1], [1, 3, 7, 15, 5])
    records = result["records"]
    assert {r["suite"] for r in records} == {suite} and all("error" not in r for r in records)
    assert all(r["solver"] != "pycma" or r["evaluations"] > 20 for r in records)
    written = json.loads((tmp_path / f"{suite}.json").read_text())
    assert written["suite"] == suite and "machine" in written and written["rows"][0]["pycma"]["problems"] == 2


def test_the_logged_indicator_is_the_last_problems_best(tmp_path):
    dat = tmp_path / "f.dat"
    dat.write_text("% header (7.9e+01)\n1 0 +5.0e+00 x\n9 0 +1.0e-09 x\n% header 2\n1 1 +3.0e+00 x\n4 1 +2.5e-01 x\n")
    assert coco_suites.logged_delta(str(dat)) == 0.25
    assert coco_suites.final_hit("bbob-noisy", False, 0.0, 1e-8) and not coco_suites.final_hit("bbob", False, 0.0, 1e-8)
    assert coco_suites.agrees("bbob-constrained", False, 5e-9, 1e-8)  # an almost feasible point under the target
    assert not coco_suites.agrees("bbob-constrained", True, 1.0, 1e-8)


def test_constrained_solved_reads_the_violations_and_noisy_the_noise_free_value(tmp_path):
    """On COCO's data: an infeasible point below f_opt is no progress with constraints, and a noisy run is
    judged by the noise-free value of what it evaluated."""
    for suite, function in (("bbob-constrained", 1), ("bbob-noisy", 1)):
        observer = cocoex.Observer(suite, f"result_folder: {suite} outer_folder: {tmp_path}")
        problems = cocoex.Suite(suite, "", f"dimensions:2 instance_indices:1 function_indices:{function}")
        problem = problems.get_problem(0)  # the suite outlives its problem
        problem.observe_with(observer)
        x0 = problem.initial_solution
        measured = [problem(x0) for _ in range(3)] + [problem(np.full(2, -4.0))]
        f_opt = coco.f_opt_from_dat(observer.result_folder, problem.id_function, 2)
        delta = coco_suites.best_delta(suite, problem, f_opt, coco.dat_path(observer.result_folder,
                                                                            problem.id_function, 2))
        if suite == "bbob-constrained":  # (-4, -4) is infeasible with f below f_opt: the logged best is x0's
            assert np.any(problem.constraint(np.full(2, -4.0)) > 0) and measured[-1] < f_opt
            assert delta == pytest.approx(measured[0] - f_opt)
        else:
            assert len(set(measured[:3])) == 3 and delta >= 0  # noise on the values, not on the indicator
        problem.free()


@pytest.mark.slow
@pytest.mark.parametrize("suite", SUITES)
def test_a_tiny_sweep_runs_es_and_pycma_on_each_suite(tmp_path, suite):
    result = tiny_sweep(tmp_path, suite, ["es", "pycma"], budget_multiplier=100)
    records = result["records"]
    assert len(records) == 4 and all("error" not in r for r in records), records
    es_records = [r for r in records if r["solver"] == "es"]
    assert all(r["evaluations"] <= r["budget"] and r["compile_s"] >= 0 for r in es_records)
    assert any(r["hits"] > 0 for r in es_records)
