"""OpenES keeps its numerics through the strategies refactor: the runs recorded on the old engine, bit for bit.

``tests/data/openes_reference.npz`` was written by ``tests/data/make_openes_reference.py`` on main at
371dba1 (before the engine became generic); the cases are defined there and rerun here with today's API
(execution settings passed to ``es.evolve``).

One case was re-recorded with the one-contract refactor (2026-11-26): ``policy_plain_zscore_small_batches``,
whose params are a two-leaf pytree: OpenES's Adam now steps the flat vector of the params (the strategies'
maths work on flat vectors), one fusion where there was one per leaf, which moved the last bits of its params;
the other three cases kept theirs.

What the run is (params, best params, best fitness, max/min fitness, invalid counts) must match bit for bit.
The summary statistics that are vector reductions (``REDUCED_METRICS``) are compared to a few float32 ulps:
XLA's CPU backend compiles reductions for the host's vector width, so their last bit depends on the CPU model
(the reference was recorded on an Intel Xeon; on an AMD EPYC without AVX2, ``params_norm`` moved by one ulp
while every param stayed bit-identical).
"""

import pathlib
import sys

import jax
import numpy as np
import pytest

import es

DATA = pathlib.Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from make_openes_reference import CASES  # noqa: E402

REFERENCE = np.load(DATA / "openes_reference.npz")
REDUCED_METRICS = ("fitness_mean", "fitness_std", "grad_norm", "update_norm", "params_norm", "sigma")


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.slow
def test_openes_matches_the_runs_recorded_before_the_refactor(name):
    kwargs, execution, fitness_fn, params, generations, devices = CASES[name]
    strategy = es.OpenES(**kwargs)
    state = strategy.init(jax.random.key(7), params)
    state, metrics = es.evolve(strategy, fitness_fn, state, generations, mesh=es.make_mesh(devices), **execution)
    got = {}
    for prefix, tree in (("params", state.params), ("best_params", state.best_params)):
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            got[f"{name}/{prefix}{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
    got[f"{name}/best_fitness"] = np.asarray(state.best_fitness)
    for key, values in metrics.items():
        got[f"{name}/metrics/{key}"] = np.asarray(values)
    expected = {key: REFERENCE[key] for key in REFERENCE.files if key.startswith(f"{name}/")}
    assert set(expected) <= set(got)  # metrics added since the recording ("stop") are not compared
    for key in expected:
        if key.rsplit("/", 1)[-1] in REDUCED_METRICS and "/metrics/" in key:
            np.testing.assert_allclose(got[key], expected[key], rtol=1e-6, atol=0, err_msg=key)
        else:
            np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
