"""OpenES keeps its numerics through the strategies refactor: the runs recorded on the old engine, bit for bit.

``tests/data/openes_reference.npz`` was written by ``tests/data/make_openes_reference.py`` on main at
371dba1 (before the engine became generic); the cases are defined there and rerun here with today's API
(execution settings passed to ``es.evolve``).
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


@pytest.mark.parametrize("name", sorted(CASES))
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
    assert sorted(got) == sorted(expected)
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
