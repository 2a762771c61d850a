"""The compile-time benchmark: a child process times each program from the checkout it is given; bad
arguments are refused naming the option."""

import os

import pytest

from experiments.bench import compile_time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_a_child_times_every_program_from_its_checkout():
    times = compile_time.child(ROOT, 0)
    assert list(times) == list(compile_time.programs())
    assert all(0 < seconds < 300 for seconds in times.values()), times


@pytest.mark.slow
def test_a_childs_program_stats_count_its_fusions_and_instructions():
    stats = compile_time.stats_child("es", "SNES")
    assert 0 < stats["s"] < 300 and 0 < stats["fusions"] < stats["instructions"], stats


@pytest.mark.parametrize("argv, fragment", [
    (["--rounds", "0"], "--rounds 0"),
    (["--compare", os.path.dirname(ROOT)], "not a checkout"),
    (["--evosax", "--compare", ROOT], "--evosax and --compare"),
    (["--evosax", "--strategies", "XNES"], "--strategies"),
])
def test_bad_arguments_are_refused_naming_the_option(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exit_:
        compile_time.main(argv)
    assert exit_.value.code == 2
    assert fragment in capsys.readouterr().err


def test_evosax_missing_is_refused_naming_the_extra(monkeypatch, capsys):
    real = compile_time.importlib.util.find_spec
    monkeypatch.setattr(compile_time.importlib.util, "find_spec",
                        lambda name, *args: None if name == "evosax" else real(name, *args))
    with pytest.raises(SystemExit) as exit_:
        compile_time.main(["--evosax"])
    assert exit_.value.code == 2
    assert '.[bench]' in capsys.readouterr().err
