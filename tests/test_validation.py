"""Bad input gets a clear ValueError/TypeError from our code, before any compilation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import sphere

import es


@pytest.fixture
def state():
    return es.OpenES(popsize=8, sigma=0.1).init(jax.random.key(0), jnp.ones(4))


def raises(exc, *fragments):
    """pytest.raises that also checks the message names the argument and the fix."""

    class _Check:
        def __enter__(self):
            self._ctx = pytest.raises(exc)
            self._info = self._ctx.__enter__()
            return self._info

        def __exit__(self, *args):
            handled = self._ctx.__exit__(*args)
            message = str(self._info.value)
            for fragment in fragments:
                assert fragment in message, f"{fragment!r} not in {message!r}"
            return handled

    return _Check()


def test_odd_popsize_with_antithetic():
    with raises(ValueError, "popsize=7", "even", "antithetic=False"):
        es.OpenES(popsize=7)
    assert es.OpenES(popsize=7, antithetic=False).popsize == 7


def test_popsize_not_divisible_by_mesh(state):
    strategy = es.OpenES(popsize=12, sigma=0.1)
    state = strategy.init(jax.random.key(0), jnp.ones(4))
    with raises(ValueError, "popsize=12", "8 devices", "multiple of 8"):
        es.evolve(strategy, sphere, state, 1, mesh=es.make_mesh(8))


@pytest.mark.parametrize("popsize", [0, 1, -4])
def test_popsize_below_two(popsize):
    with raises(ValueError, f"popsize={popsize}", "at least 2"):
        es.OpenES(popsize=popsize, antithetic=False)


def test_non_int_popsize():
    with raises(TypeError, "popsize"):
        es.OpenES(popsize=8.0)


@pytest.mark.parametrize("sigma", [0.0, -0.1, float("nan"), float("inf")])
def test_sigma_not_positive(sigma):
    with raises(ValueError, "sigma", "> 0"):
        es.OpenES(popsize=8, sigma=sigma)


def test_sigma_of_wrong_type():
    with raises(TypeError, "sigma", "schedule"):
        es.OpenES(popsize=8, sigma="0.1")


@pytest.mark.parametrize(
    "params, exc, fragment",
    [
        (jnp.arange(4), TypeError, "int32"),
        ({"w": jnp.ones(3), "n": jnp.array([1, 2])}, TypeError, "['n']"),
        ({}, ValueError, "empty"),
        (jnp.zeros((0,)), ValueError, "empty"),
        ([jnp.ones(2), jnp.array([True])], TypeError, "bool"),
        ({"w": jnp.ones(3), "name": "layer"}, TypeError, "params['name'] is str 'layer', not an array of numbers"),
        (jnp.array([0.0, jnp.nan]), ValueError, "holds 1 NaN or inf value(s) (the first at flat index 1: nan)"),
        ({"w": jnp.ones(3), "b": np.array([np.inf, 0.0])}, ValueError, "params['b'] holds 1 NaN or inf"),
    ],
)
def test_non_float_empty_or_non_finite_params(params, exc, fragment):
    with raises(exc, "params", fragment):
        es.OpenES(popsize=8).init(jax.random.key(0), params)


def test_bad_key():
    with raises(TypeError, "key", "jax.random.key"):
        es.OpenES(popsize=8).init(0, jnp.ones(3))


@pytest.mark.parametrize(
    "fitness_fn, fragment",
    [
        (lambda x, key: x, "float32[4]"),
        (lambda x, key: (jnp.sum(x), 1.0), "scalar"),
        (lambda x, key: jnp.sum(x).astype(jnp.complex64), "real number"),
    ],
)
def test_fitness_fn_not_returning_a_scalar(state, fitness_fn, fragment):
    with raises(TypeError, "fitness_fn(params, key)", fragment):
        es.evolve(es.OpenES(popsize=8, sigma=0.1), fitness_fn, state, 1)


def test_fitness_fn_not_callable(state):
    with raises(TypeError, "fitness_fn", "callable"):
        es.evolve(es.OpenES(popsize=8, sigma=0.1), 3.0, state, 1)


def test_a_fitness_fn_that_cannot_take_params_and_key_is_refused_naming_the_signature(state):
    def sphere(x):
        return -jnp.sum(x**2)

    with raises(TypeError, "fitness_fn sphere(x)", "must take (params, key)", "def sphere(params, key)"):
        es.evolve(es.OpenES(popsize=8, sigma=0.1), sphere, state, 1)


def test_more_devices_than_exist():
    with raises(ValueError, "num_devices=9", "only 8", "xla_force_host_platform_device_count", "jax_num_cpu_devices"):
        es.make_mesh(9)
    with raises(ValueError, "num_devices=0"):
        es.make_mesh(0)


def test_mesh_of_wrong_type(state):
    with raises(TypeError, "mesh", "es.make_mesh"):
        es.evolve(es.OpenES(popsize=8, sigma=0.1), sphere, state, 1, mesh=8)


def test_negative_generations(state):
    with raises(ValueError, "num_generations=-1", "0 or more"):
        es.evolve(es.OpenES(popsize=8, sigma=0.1), sphere, state, -1)
    with raises(TypeError, "num_generations", "Python int"):
        es.evolve(es.OpenES(popsize=8, sigma=0.1), sphere, state, 2.5)


def test_unknown_fitness_shaping():
    with raises(ValueError, "fitness_shaping='rank'", "centered_rank", "z_score", "raw"):
        es.OpenES(popsize=8, fitness_shaping="rank")
    with raises(TypeError, "fitness_shaping"):
        es.OpenES(popsize=8, fitness_shaping=3)


def test_shaping_callable_of_wrong_shape_is_refused_by_the_constructor():
    with raises(TypeError, "fitness_shaping", "float32[8]"):
        es.OpenES(popsize=8, sigma=0.1, fitness_shaping=lambda f: jnp.sum(f))


@pytest.mark.parametrize("schedule", [lambda g: jnp.full(4, 0.1), lambda g: (0.1,), lambda g: 0.1 / float(g + 1)],
                         ids=["shaped-like-params", "a-tuple", "not-traceable"])
def test_sigma_schedule_not_returning_a_scalar_is_refused_by_the_constructor(schedule):
    with raises(TypeError, "OpenES(sigma=", "sigma schedule", "one float per generation"):
        es.OpenES(popsize=8, sigma=schedule)


def test_optimizer_not_an_optax_transformation():
    with raises(TypeError, "optimizer", "optax.GradientTransformation", "optax.adam"):
        es.OpenES(popsize=8, optimizer=lambda g: g)
    with raises(TypeError, "optimizer"):
        es.OpenES(popsize=8, optimizer=optax.adam)  # the factory, not the transformation


def test_negative_weight_decay():
    with raises(ValueError, "weight_decay=-0.1", ">= 0"):
        es.OpenES(popsize=8, weight_decay=-0.1)


def test_state_made_by_a_different_strategy():
    adam = es.OpenES(popsize=8, sigma=0.1, optimizer=optax.adam(0.01))
    sgd = es.OpenES(popsize=8, sigma=0.1, optimizer=optax.sgd(0.01, momentum=0.9))
    state = adam.init(jax.random.key(0), jnp.ones(4))
    with raises(ValueError, "opt_state", "different strategy", "strategy.init"):
        es.evolve(sgd, sphere, state, 1)


def test_state_for_other_params_shapes():
    strategy = es.OpenES(popsize=8, sigma=0.1)
    state = strategy.init(jax.random.key(0), jnp.ones(4))
    state = state._replace(params=jnp.ones(5), best_params=jnp.ones(5))
    with raises(ValueError, "opt_state"):
        es.evolve(strategy, sphere, state, 1)


def test_state_of_wrong_type():
    with raises(TypeError, "state", "strategy.init"):
        es.evolve(es.OpenES(popsize=8), sphere, {"params": jnp.ones(3)}, 1)


def test_execution_options_belong_to_evolve_and_are_checked_there(state):
    for name, value in (("exchange", "gradient"), ("eval_batch_size", 4), ("update_batch_size", 4)):
        with raises(TypeError, f"OpenES({name}=...)", "no longer part of the strategy", "es.evolve(", f"{name}="):
            es.OpenES(popsize=8, **{name: value})
    strategy = es.OpenES(popsize=8, sigma=0.1)
    with raises(ValueError, "exchange='all'", "fitness", "gradient"):
        es.evolve(strategy, sphere, state, 1, exchange="all")
    with raises(ValueError, "eval_batch_size=0"):
        es.evolve(strategy, sphere, state, 1, eval_batch_size=0)
    with raises(ValueError, "update_batch_size=-1"):
        es.evolve(strategy, sphere, state, 1, update_batch_size=-1)


def test_other_options():
    with raises(TypeError, "noise"):
        es.OpenES(popsize=8, noise="table")
    with raises(TypeError, "antithetic"):
        es.OpenES(popsize=8, antithetic=1)
    with raises(TypeError, "maximize"):
        es.OpenES(popsize=8, maximize="yes")


def test_stateful_fitness_without_its_state(state):
    fitness = es.StatefulFitness(
        init=lambda: jnp.zeros(()),
        evaluate=lambda p, k, s: (jnp.sum(p), jnp.zeros(())),
        update=lambda s, stats: s,
    )
    with raises(ValueError, "fitness_state", "strategy.init(key, params, fitness=fitness_fn)"):
        es.evolve(es.OpenES(popsize=8, sigma=0.1), fitness, state, 1)


def test_errors_come_before_compilation(monkeypatch, state):
    """No XLA compilation is attempted for any of the invalid calls."""
    compiled = []
    original = jax.stages.Lowered.compile
    monkeypatch.setattr(jax.stages.Lowered, "compile", lambda *a, **k: compiled.append(1) or original(*a, **k))
    with pytest.raises(TypeError):
        es.evolve(es.OpenES(popsize=8, sigma=0.1), lambda x, k: x, state, 1)
    with pytest.raises(ValueError):
        es.evolve(es.OpenES(popsize=12, sigma=0.1), sphere, state, 1, mesh=es.make_mesh(8))
    assert compiled == []


def test_a_jax_fitness_that_fails_when_traced_gets_an_es_error_naming_its_line_and_the_fix():
    def branching(params, key):
        if params[0] > 0:  # Python control flow on a traced value
            return 1.0
        return jnp.sum(params)

    line = branching.__code__.co_firstlineno + 1
    strategy = es.SNES(popsize=8)
    state = strategy.init(jax.random.key(0), jnp.zeros(3))
    with raises(es.FitnessError, "fitness_fn(params, key) raised TracerBoolConversionError",
                f"test_validation.py:{line} (branching)", "float32[3]", "jnp.where", "es.HostFitness") as info:
        es.evolve(strategy, branching, state, 1)
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no JAX traceback chained


def test_evolve_checks_a_signature_once_and_still_refuses_another(state, monkeypatch):
    """The checks that trace (strategy.init, the fitness) run once per strategy, fitness, state signature and
    settings: a second call with the same takes the remembered result, and a state that another strategy made
    is still refused with the message naming the difference."""
    from es.engine import execution
    from es.fitness import adapter

    strategy = es.OpenES(popsize=8, sigma=0.1)
    first = execution.check_evolve_args(strategy, adapter(sphere), state, 1, None)

    def checked_again(*args):
        raise AssertionError("the checks ran again for a signature that passed them")

    with monkeypatch.context() as patched:
        patched.setattr(execution, "check_state", checked_again)
        assert execution.check_evolve_args(strategy, adapter(sphere), state, 1, None) == first
    sgd = es.OpenES(popsize=8, sigma=0.1, optimizer=optax.sgd(0.01, momentum=0.9))
    with raises(ValueError, "opt_state", "different strategy", "strategy.init"):
        execution.check_evolve_args(sgd, adapter(sphere), state, 1, None)
    with raises(ValueError, "opt_state"):
        execution.check_evolve_args(strategy, adapter(sphere), state._replace(params=jnp.ones(5),
                                                                              best_params=jnp.ones(5)), 1, None)
