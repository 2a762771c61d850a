"""Every strategy keeps its numerics through refactors: the runs recorded on main before them, bit for bit.

``tests/data/strategy_references.npz`` was written by ``tests/data/make_strategy_references.py`` (its
docstring says when and where). What a run is (params, best params, best fitness, per-coordinate scales,
max/min fitness, invalid counts) must match bit for bit; the metrics that are vector reductions
(``REDUCED_METRICS``) to a few float32 ulps (XLA's CPU reductions follow the host's vector width).
"""

import pathlib
import sys

import jax
import numpy as np
import pytest

import es

DATA = pathlib.Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
import make_strategy_references as cases  # noqa: E402

pytestmark = pytest.mark.slow  # make test-fast leaves it out: every strategy against its recorded runs

REFERENCE = np.load(DATA / "strategy_references.npz")
REDUCED_METRICS = ("fitness_mean", "fitness_std", "grad_norm", "update_norm", "params_norm", "sigma")


def check(name, state, metrics):
    got = {}
    cases.record(got, name, state, metrics)
    expected = {key: REFERENCE[key] for key in REFERENCE.files if key.startswith(f"{name}/")}
    assert set(expected) <= set(got)  # metrics added since the recording ("stop") are not compared
    for key in expected:
        if "/metrics/" in key and key.rsplit("/", 1)[-1] in REDUCED_METRICS:
            np.testing.assert_allclose(got[key], expected[key], rtol=1e-6, atol=0, err_msg=key)
        else:
            np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


@pytest.mark.parametrize("name", sorted(cases.strategies()))
def test_evolve_matches_the_recorded_run(name):
    strategy, fitness, params, generations, options = cases.strategies()[name]
    options = dict(options)
    mesh = es.make_mesh(options.pop("devices"))
    state = strategy.init(jax.random.key(7), params)
    check(name, *es.evolve(strategy, fitness, state, generations, mesh=mesh, **options))


def test_ask_tell_matches_the_recorded_run():
    check("sepcma_ask_tell", *cases.ask_tell_case())


def test_evolve_many_matches_the_recorded_runs():
    states, metrics = cases.sweep_case()
    for i, (state, run_metrics) in enumerate(zip(states, metrics)):
        check(f"snes_sweep_{i}", state, run_metrics)
