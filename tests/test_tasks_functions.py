"""Benchmark-function tasks: known optima, BBOB-style shifts and rotations, and the registry's errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import es
import tasks
from tasks import bbob, functions

CLASSIC = sorted(functions.BENCHMARKS)
BBOB = sorted(bbob.BBOB_FUNCTIONS)


def _values(task, points):
    return np.asarray(jax.jit(jax.vmap(task.function))(jnp.asarray(points, jnp.float32)))


def _neighbours(center, radius, count=64, seed=0):
    """``count`` points at distance ``radius`` from ``center`` in random directions."""
    rng = np.random.default_rng(seed)
    directions = rng.standard_normal((count, center.shape[0]))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    return center + radius * directions


@pytest.mark.parametrize("name", CLASSIC)
def test_known_optimum_value_and_that_it_is_a_local_minimum(name):
    task = tasks.make(name, dim=6)
    x_star = task.optimum()
    value = float(task.function(jnp.asarray(x_star)))
    # Schwefel's 418.9829 constant is rounded, and float32 sums leave ~1e-4.
    np.testing.assert_allclose(value, task.optimal_value(), rtol=1e-5, atol=2e-4)
    assert float(task.fitness(jnp.asarray(x_star), jax.random.key(0))) == pytest.approx(-value)
    width = task.upper - task.lower
    for radius in (1e-3 * width, 1e-2 * width):
        assert np.all(_values(task, _neighbours(x_star, radius)) > value), f"{name}: not a minimum at r={radius}"
    # Every one of these optima is global: random points of the box are all worse.
    box = np.random.default_rng(1).uniform(task.lower, task.upper, (256, task.dim))
    assert np.all(_values(task, box) > value)


def test_optimum_values_from_their_definitions():
    """Hand-derived: the sphere, ellipsoid and Rosenbrock vanish at their minimisers; Styblinski-Tang at
    x_i = -2.903534 is ((x^4 - 16 x^2 + 5 x) / 2) * D = -39.16617 * D."""
    x = functions.STYBLINSKI_TANG_ARGMIN
    assert functions.STYBLINSKI_TANG_MIN_PER_DIM == pytest.approx((x**4 - 16 * x**2 + 5 * x) / 2, abs=1e-9)
    assert float(functions.sphere(jnp.zeros(5))) == 0.0
    assert float(functions.ellipsoid(jnp.zeros(5))) == 0.0
    assert float(functions.rosenbrock(jnp.ones(5))) == 0.0
    assert float(functions.ellipsoid(jnp.array([0.0, 0.0, 1.0]))) == pytest.approx(1e6)  # the last axis: 10^6
    assert float(functions.rosenbrock(jnp.zeros(2))) == pytest.approx(1.0)


@pytest.mark.parametrize("name", BBOB)
def test_bbob_optimum_is_the_shift_with_value_zero_and_a_local_minimum(name):
    task = tasks.make(name, dim=5, seed=3)
    assert task.rotate  # dim <= 100: rotated by default
    x_opt = task.optimum()
    assert np.all(np.abs(x_opt) <= 4.0) and np.any(np.abs(x_opt) > 0.1)
    assert float(task.function(jnp.asarray(x_opt))) == 0.0
    for radius in (1e-2, 1e-1):
        assert np.all(_values(task, _neighbours(x_opt, radius, seed=1)) > 0.0)


def test_bbob_constants_are_derived_from_the_seed_alone():
    a, b, c = tasks.make("bbob_rastrigin", dim=8, seed=1), tasks.make("bbob_rastrigin", dim=8, seed=1), tasks.make(
        "bbob_rastrigin", dim=8, seed=2
    )
    assert a == b and hash(a) == hash(b) and a != c
    np.testing.assert_array_equal(a.optimum(), b.optimum())
    assert not np.array_equal(a.optimum(), c.optimum())
    x_opt, rotation, other = a._constants
    np.testing.assert_allclose(rotation @ rotation.T, np.eye(8), atol=1e-5)
    np.testing.assert_allclose(other @ other.T, np.eye(8), atol=1e-5)
    assert not np.allclose(rotation, np.eye(8))


def test_bbob_rotation_is_automatic_for_small_dims_only_and_can_be_forced():
    assert tasks.make("bbob_ellipsoid", dim=bbob.AUTO_ROTATE_MAX_DIM).rotate
    assert not tasks.make("bbob_ellipsoid", dim=bbob.AUTO_ROTATE_MAX_DIM + 1).rotate
    assert tasks.make("bbob_ellipsoid", dim=200, rotate=True).rotate
    separable = tasks.make("bbob_ellipsoid", dim=4, rotate=False)
    x_opt, rotation, _ = separable._constants
    np.testing.assert_array_equal(rotation, np.eye(4))
    with pytest.raises(ValueError, match="rotate=False"):
        tasks.make("bbob_ellipsoid", dim=bbob.ROTATE_MAX_DIM + 1, rotate=True)


def test_bbob_rotation_changes_the_function_but_not_the_optimum():
    rotated = tasks.make("bbob_ellipsoid", dim=6, seed=0, rotate=True)
    plain = tasks.make("bbob_ellipsoid", dim=6, seed=0, rotate=False)
    np.testing.assert_array_equal(rotated.optimum(), plain.optimum())
    x = jnp.asarray(plain.optimum()) + 0.3
    assert float(rotated.function(x)) != pytest.approx(float(plain.function(x)), rel=1e-3)


def test_registry_lists_every_function_and_rejects_bad_names_and_options():
    for name in CLASSIC + BBOB:
        assert name in tasks.names()
    assert "bbob_ellipsoid" in tasks.names() and "styblinski_tang" in tasks.names()
    with pytest.raises(ValueError, match=r"unknown task 'styblinski-tang'.*styblinski_tang"):
        tasks.make("styblinski-tang")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['seed'\].*valid options: \['dim'\]"):
        tasks.make("sphere", seed=1)
    with pytest.raises(ValueError, match=r"tasks\.make\('ackley', dim=0\): dim must be at least 1 \(e\.g\. dim=10\)"):
        tasks.make("ackley", dim=0)
    with pytest.raises(ValueError, match=r"tasks\.make\('bbob_sphere', seed=-1\): seed must be at least 0"):
        tasks.make("bbob_sphere", seed=-1)
    with pytest.raises(TypeError, match=r"tasks\.make\('bbob_sphere', rotate='yes'\): rotate must be True, False or None"):
        tasks.make("bbob_sphere", rotate="yes")
    assert tasks.options("bbob_sphere") == ["dim", "seed", "rotate"]


def test_make_looks_a_family_name_up_once(monkeypatch):
    from tasks import registry

    calls = []

    def list_names():
        calls.append(1)
        return ["counted-task"]

    monkeypatch.setattr(registry, "_FAMILIES", [(list_names, lambda name: lambda scale=1.0: (name, scale))])
    assert tasks.make("counted-task", scale=2.0) == ("counted-task", 2.0)
    assert len(calls) == 1
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['size'\].*\['scale'\]"):
        tasks.make("counted-task", size=2)


@pytest.mark.slow
def test_default_strategy_makes_progress_on_a_shifted_rotated_rastrigin_under_evolve():
    task = tasks.make("bbob_rastrigin", dim=12, seed=5)
    strategy = tasks.default_strategy(task)
    state = strategy.init(jax.random.key(0), task.init_params(jax.random.key(1)), fitness=task.fitness)
    assert state.fitness_state is None  # a plain fitness: nothing but fitnesses is exchanged
    final, metrics = es.evolve(strategy, task.fitness, state, 20, mesh=es.make_mesh(4))
    start, end = -float(task.fitness(state.params, None)), -float(task.fitness(final.params, None))
    assert end < 0.7 * start
    assert np.all(np.diff(np.asarray(metrics["best_fitness"])) >= 0)
