"""The suite's compile profile: the plugin records each compilation under the test that ran it, and the
report adds them up per program, file and test."""

import json

import pytest

from experiments.bench import suite_compiles


def test_the_summary_adds_compilations_per_program_file_and_test():
    rows = [
        {"test": "tests/a.py::t1", "kind": "trace", "s": 0.5, "fun": "f"},
        {"test": "tests/a.py::t1", "kind": "compile", "s": 2.0, "fun": "jit(f)"},
        {"test": "tests/a.py::t1", "kind": "compile", "s": 1.0, "fun": "jit(g)"},
        {"test": "tests/a.py::t1", "kind": "test", "s": 4.0, "fun": ""},
        {"test": "tests/b.py::t2", "kind": "compile", "s": 3.0, "fun": "jit(f)"},
        {"test": "tests/b.py::t2", "kind": "test", "s": 3.5, "fun": ""},
    ]
    summary = suite_compiles.summarise(rows)
    assert summary["totals"]["compile"] == {"count": 3, "s": 6.0}
    assert summary["programs"][0] == {"program": "jit(f)", "compilations": 2, "s": 5.0}
    assert summary["files"][0] == {"file": "tests/a.py", "test_s": 4.0, "jax_s": 3.5}
    assert summary["tests"][1] == {"test": "tests/b.py::t2", "test_s": 3.5, "compilations": 1, "compile_s": 3.0}
    assert "| jit(f) | 2 | 5.0 |" in suite_compiles.report_text(summary)


def test_a_run_records_the_compilations_of_each_test(tmp_path):
    test_file = tmp_path / "test_tiny.py"
    test_file.write_text("import jax, jax.numpy as jnp\n\n"
                         "def test_one():\n"
                         "    assert float(jax.jit(lambda x: jnp.sin(x) * 2)(1.0)) > 0\n")
    out = tmp_path / "profile.json"
    assert suite_compiles.main([str(test_file), "--jobs", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["tests_passed"] and result["totals"]["test"]["count"] == 1
    compiled = [t for t in result["tests"] if t["test"].endswith("test_tiny.py::test_one")]
    assert compiled and compiled[0]["compilations"] >= 1, result["tests"]
    assert any(p["program"] == "jit(<lambda>)" for p in result["programs"]), result["programs"]


@pytest.mark.parametrize("argv, fragment", [(["--jobs", "0"], "--jobs 0"), (["--top", "0"], "--top 0")])
def test_bad_arguments_are_refused_naming_the_option(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exit_:
        suite_compiles.main(argv)
    assert exit_.value.code == 2
    assert fragment in capsys.readouterr().err
