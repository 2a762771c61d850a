"""The UNROLL benchmark: a child process measures one cell with the UNROLL it is given; bad arguments are
refused naming the option."""

import pytest

from experiments.bench import unroll


@pytest.mark.slow
def test_a_child_measures_a_cell_with_its_unroll():
    result = unroll.child("OpenES", "prng", 1000, 2)  # few params: quick
    assert set(result) == {"compile_s", "generation_s"}, result
    assert 0 < result["compile_s"] < 300 and 0 < result["generation_s"] < 60, result


@pytest.mark.parametrize("argv, fragment", [
    (["--rounds", "0"], "--rounds 0"),
    (["--unroll", "8", "0"], "--unroll 8 0"),
    (["--dims", "0.5"], "--dims 0.5"),
])
def test_bad_arguments_are_refused_naming_the_option(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exit_:
        unroll.main(argv)
    assert exit_.value.code == 2
    assert fragment in capsys.readouterr().err
