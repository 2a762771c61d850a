"""The COCO benchmark: f_opt read from COCO's own data is exact, and a tiny sweep solves the sphere and reports it."""

import json
import types

import numpy as np
import pytest

from experiments.bench import coco

cocoex = pytest.importorskip("cocoex", reason="COCO's bbob suite: pip install -e '.[bench]'")
PYCMA = "pycma, the baseline: pip install -e '.[bench]'"


def test_the_targets_are_cocos_51_and_hits_count_those_reached():
    assert len(coco.TARGETS) == 51 and coco.TARGETS[0] == 100.0 and coco.TARGETS[-1] == pytest.approx(1e-8)
    assert np.allclose(np.diff(np.log10(coco.TARGETS)), -0.2)
    assert coco.hits(1e3) == 0 and coco.hits(100.0) == 1 and coco.hits(0.5) == 12 and coco.hits(0.0) == 51
    assert coco.parse_indices("1-3,5, 3") == [1, 2, 3, 5]


def test_f_opt_from_cocos_dat_header_is_the_sphere_minimum(tmp_path):
    """On f1, f(x) - f_opt = |x - x_opt|^2: solve x_opt from three evaluations, and f there is f_opt."""
    observer = cocoex.Observer("bbob", f"result_folder: f1 outer_folder: {tmp_path}")
    suite = cocoex.Suite("bbob", "", "dimensions:2 instance_indices:3 function_indices:1")  # outlives its problem
    problem = suite.get_problem(0)
    problem.observe_with(observer)
    f0 = problem(np.zeros(2))
    f_opt = coco.f_opt_from_dat(observer.result_folder, 1, 2)
    units = [problem(np.eye(2)[i]) for i in range(2)]  # |e_i - x_opt|^2 - |x_opt|^2 = 1 - 2 x_opt_i
    x_opt = np.array([(1 - (u - f0)) / 2 for u in units])
    assert not problem.final_target_hit
    assert abs(problem(x_opt) - f_opt) < 1e-9 and abs(f0 - f_opt - x_opt @ x_opt) < 1e-9
    assert problem.final_target_hit  # cocoex agrees: x_opt is within 1e-8 of f_opt
    problem.free()


@pytest.mark.slow
def test_a_tiny_sweep_solves_the_sphere_and_writes_the_table(tmp_path):
    pytest.importorskip("cma", reason=PYCMA)
    solvers = ["pycma"] + (["es"] if coco.es_available() else [])
    out = tmp_path / "coco.json"
    result = coco.sweep([2], [1, 2], [1], solvers, 1000, str(tmp_path / "coco"), "t", 1, "zero", str(out),
                        log=lambda *_: None)
    records = {(r["solver"], r["function"]): r for r in result["records"]}
    assert len(records) == 2 * len(solvers)
    sphere = records["pycma", 1]
    assert sphere["final_target_hit"] and sphere["hits"] == 51 and sphere["best_delta"] <= 1e-8
    assert sphere["evaluations"] <= 2000 and "error" not in sphere
    if "es" in solvers:  # two es.minimize calls on cocoex problems, the first freed before the second
        assert records["es", 1]["final_target_hit"] and records["es", 1]["evaluations"] <= 2000
        assert all("error" not in records["es", f] for f in (1, 2))
    written = json.loads(out.read_text())
    (row,) = written["rows"]
    assert row["dim"] == 2 and row["pycma"]["problems"] == 2 and row["pycma"]["final_hits"] >= 1
    assert row["pycma"]["solved"] == sum(r["hits"] for r in result["records"] if r["solver"] == "pycma") / 102
    assert coco.report([str(tmp_path / "coco" / "t-problems.jsonl")]) == written["rows"]
    # a resumed sweep's records: a problem run again counts once (its last record), one that only a solver ran
    # not at all
    again = dict(records["pycma", 1], hits=0, final_target_hit=False)
    alone = dict(records["pycma", 2], id="bbob_f003_i01_d02", function=3)
    (tmp_path / "more.jsonl").write_text(json.dumps(again) + "\n" + json.dumps(alone) + "\n")
    (resumed,) = coco.report([str(tmp_path / "coco" / "t-problems.jsonl"), str(tmp_path / "more.jsonl")])
    expected = (sum(r["hits"] for r in result["records"] if r["solver"] == "pycma") - 51) / 102
    assert resumed["pycma"]["problems"] == (2 if "es" in solvers else 3)
    if "es" in solvers:
        assert resumed["pycma"]["solved"] == expected
    text = (tmp_path / "coco.md").read_text()
    assert text.startswith("| dimension | problems | es solved % | pycma solved % | difference (pp) | es wall s |")
    assert text.splitlines()[2].startswith("| 2 | 2 |")
    if "es" not in solvers:
        assert "| n/a |" in text  # es's columns


def test_the_solved_fractions_agree_with_cocopp(tmp_path):
    pytest.importorskip("cma", reason=PYCMA)
    pytest.importorskip("cocopp", reason="cocopp: pip install -e '.[bench]'")
    result = coco.sweep([2], [1, 3], [1, 2], ["pycma"], 200, str(tmp_path / "coco"), "t", 1, "zero", None,
                        log=lambda *_: None)
    ours = sum(r["hits"] for r in result["records"]) / (4 * 51)
    assert 0 < ours < 1
    assert coco.cocopp_solved(result["folders"]["pycma"]) == {2: pytest.approx(ours)}


def test_the_es_side_calls_es_minimize_as_specified_and_times_its_compilations(tmp_path, monkeypatch):
    """A stand-in es.minimize (random search around x0, one jitted call) takes the es side's exact call."""
    pytest.importorskip("cma", reason=PYCMA)
    import jax
    import jax.numpy as jnp

    import es

    calls = []

    def minimize(fun, x0, sigma0, *, strategy=None, max_evals, target=None, restarts=None, seed=0):
        calls.append({"sigma0": sigma0, "max_evals": max_evals, "target": target, "restarts": restarts, "seed": seed})
        rng = np.random.default_rng(seed)
        shift = float(jax.jit(lambda v: jnp.sum(v) * 0.0)(jnp.arange(3.0 + len(calls))))  # compiles once per call
        best = min(fun(np.asarray(x0) + shift + sigma0 * 0.1 * rng.standard_normal(len(x0))) for _ in range(max_evals))
        return types.SimpleNamespace(x=x0, fun=best, nfev=max_evals, nit=1, restarts=0, stop=["max_evals"],
                                     success=best <= target, history=None)

    monkeypatch.setattr(es, "minimize", minimize, raising=False)
    assert coco.es_available()
    result = coco.sweep([2], [1], [1, 2], ["es", "pycma"], 50, str(tmp_path / "coco"), "t", 7, "zero", None,
                        log=lambda *_: None)
    assert [c["restarts"] for c in calls] == ["bipop", "bipop"] and {c["sigma0"] for c in calls} == {coco.SIGMA0}
    assert [c["max_evals"] for c in calls] == [99, 99]  # the budget 50 x 2, less the evaluation of x0
    assert [c["seed"] for c in calls] == [coco.problem_seed(7, 2, 1, i) for i in (1, 2)]
    es_records = [r for r in result["records"] if r["solver"] == "es"]
    assert [r["evaluations"] for r in es_records] == [100, 100] and all("error" not in r for r in es_records)
    for record, call in zip(es_records, calls):
        assert call["target"] == record["f_opt"] + coco.FINAL_TARGET
        assert record["compiles"] >= 1 and record["compile_s"] > 0
    (row,) = result["rows"]
    assert row["es"]["problems"] == row["pycma"]["problems"] == 2
    assert "n/a" not in coco.table_row(row)
