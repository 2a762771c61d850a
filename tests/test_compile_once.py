"""Compile once: the state that any entry point returns runs the program that ``init``'s state ran.

A new program shows as a built program (``helpers.programs_built``), whether XLA compiles it or loads it from
the persistent compilation cache, so these tests hold however warm the cache is.
"""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import GENERATIONS, POPSIZE, STRATEGIES, programs_built, sphere

import es

PARAMS = jnp.ones(5)
EVERY_STRATEGY = {**STRATEGIES, "CMAES": es.CMAES(popsize=POPSIZE, sigma=0.3)}


@pytest.mark.parametrize("name", sorted(EVERY_STRATEGY))
def test_a_second_evolve_call_builds_no_program(name):
    strategy = EVERY_STRATEGY[name]
    state, _ = es.evolve(strategy, sphere, strategy.init(jax.random.key(0), PARAMS), GENERATIONS)
    with programs_built() as built:
        jax.block_until_ready(es.evolve(strategy, sphere, state, GENERATIONS))
    assert built == [], built


def test_weakly_typed_params_give_a_first_state_typed_like_the_state_evolve_returns():
    """``jnp.full(n, 1.0)`` is weakly typed, and the weak type is part of a program's key: init's state from it
    made the second ``evolve`` call compile again (seen on a GPU, where it cost 1.8 s a call)."""
    strategy = STRATEGIES["SNES"]
    weak = jnp.full(PARAMS.shape, 1.0)
    assert jax.typeof(weak).weak_type

    def types(state):
        return jax.tree.map(lambda x: (x.shape, x.dtype, jax.typeof(x).weak_type), state)

    state = strategy.init(jax.random.key(0), weak)
    returned, _ = es.evolve(strategy, sphere, state, GENERATIONS)  # PARAMS' program (jnp.ones: strongly typed)
    assert types(state) == types(returned)
    with programs_built() as built:
        jax.block_until_ready(es.evolve(strategy, sphere, returned, GENERATIONS))
    assert built == [], built
    python_float = strategy.init(jax.random.key(0), {"b": 0.5})  # a Python float leaf, weakly typed too
    assert not any(jax.typeof(x).weak_type for x in jax.tree.leaves(python_float))


def test_the_default_mesh_and_a_one_device_mesh_share_one_program():
    strategy = STRATEGIES["SNES"]
    state = strategy.init(jax.random.key(0), PARAMS)
    assert es.parallel.mesh.resolve_mesh(None) == es.make_mesh(1)
    default = es.evolve(strategy, sphere, state, GENERATIONS)
    with programs_built() as built:
        one_device = es.evolve(strategy, sphere, state, GENERATIONS, mesh=es.make_mesh(1))
    assert built == [], built
    chex.assert_trees_all_equal(one_device, default)


def test_an_evolve_many_call_is_one_program_and_a_second_call_builds_none():
    strategies = [STRATEGIES["SNES"], STRATEGIES["SNES"]]
    states = [s.init(jax.random.key(i), PARAMS) for i, s in enumerate(strategies)]
    with programs_built() as first:  # the runs stacked and split inside it: no programs of their own
        states, _ = es.evolve_many(strategies, sphere, states, GENERATIONS)
    assert first == ["jit(_evolve_many_compiled)"], first
    with programs_built() as built:
        jax.block_until_ready(es.evolve_many(strategies, sphere, states, GENERATIONS))
    assert built == [], built


def test_the_second_segment_of_a_run_builds_no_program(tmp_path):
    strategy = STRATEGIES["OpenES"]
    state = strategy.init(jax.random.key(0), PARAMS)
    es.run(strategy, sphere, state, GENERATIONS, run_dir=tmp_path / "one", segment=GENERATIONS, progress=False)
    with programs_built() as built:  # three segments, the first as above
        final = es.run(strategy, sphere, state, 3 * GENERATIONS, run_dir=tmp_path / "three", segment=GENERATIONS,
                       progress=False)
    assert int(final.state.generation) == 3 * GENERATIONS
    assert built == [], built


def test_a_shorter_last_segment_and_a_resumed_one_run_the_segments_program_with_the_bits_of_evolve(tmp_path):
    """Segments of 2 over 3 generations (2, then a shorter 1), resumed to 6 (a shorter 1 to reach a multiple of
    2, then 2): one ``es.evolve`` program, each segment's count a run-time value of it; the state and the
    metrics those of ``es.evolve``'s (two calls of ``GENERATIONS``: the program this file's first test builds)."""
    strategy = STRATEGIES["SNES"]
    state = strategy.init(jax.random.key(0), PARAMS)
    with programs_built() as built:
        es.run(strategy, sphere, state, GENERATIONS, run_dir=tmp_path, segment=2, progress=False)
        run = es.run(strategy, sphere, state, 2 * GENERATIONS, run_dir=tmp_path, segment=2, resume=True,
                     progress=False)
    assert built.count("jit(_evolve_compiled)") == 1, built
    half, first = es.evolve(strategy, sphere, state, GENERATIONS)
    straight, second = es.evolve(strategy, sphere, half, GENERATIONS)
    chex.assert_trees_all_equal(run.state, straight)
    chex.assert_trees_all_equal(run.metrics, jax.tree.map(lambda a, b: np.concatenate([a, b]), first, second))


def test_a_sweeps_shorter_last_segment_runs_the_segments_program_with_the_bits_of_evolve_many():
    strategies = [STRATEGIES["SNES"], STRATEGIES["SNES"]]
    states = [s.init(jax.random.key(i), PARAMS) for i, s in enumerate(strategies)]  # as the evolve_many test's
    with programs_built() as built:
        results = es.run_many(strategies, sphere, states, GENERATIONS, segment=2, progress=False)  # 2, then 1
    assert built.count("jit(_evolve_many_compiled)") == 1, built
    finals, metrics = es.evolve_many(strategies, sphere, states, GENERATIONS)
    for result, final, run_metrics in zip(results, finals, metrics):
        chex.assert_trees_all_equal(result.state, final)
        chex.assert_trees_all_equal(result.metrics, jax.tree.map(np.asarray, run_metrics))


@pytest.mark.parametrize("name", ["SNES", "SepCMAES"])
def test_the_second_ask_tell_generation_builds_no_program(name):
    strategy = STRATEGIES[name]
    state = strategy.init(jax.random.key(0), PARAMS)

    def generation(state):
        members = np.asarray(es.ask(strategy, state))
        return es.tell(strategy, state, -np.sum(members**2, axis=1))[0]

    state = generation(state)
    with programs_built() as built:
        state = generation(generation(state))
    assert int(state.generation) == 3
    assert built == [], built


@pytest.mark.parametrize("name", ["SNES", "ARS", "SepCMAES", "CMAES"])
def test_init_at_a_new_number_of_params_builds_no_program(name):
    """The first state of a strategy without an optax optimizer is put on the device: an eager jnp.zeros,
    jnp.eye or jnp.full would compile a program for each new shape (OpenES and PGPE: optax's init does)."""
    key = jax.random.key(0)
    params = jax.device_put(np.ones(11 + sorted(EVERY_STRATEGY).index(name), np.float32))  # a size for each
    with programs_built() as built:
        jax.block_until_ready(EVERY_STRATEGY[name].init(key, params))
    assert built == [], built


def test_init_at_a_new_popsize_builds_no_program():
    """A restart of es.minimize inits at a new popsize: its state is put on the device, never compiled for."""
    strategy = EVERY_STRATEGY["CMAES"]
    jax.block_until_ready(strategy.init(jax.random.key(0), PARAMS))
    with programs_built() as built:
        jax.block_until_ready(dataclasses.replace(strategy, popsize=2 * POPSIZE).init(jax.random.key(1), PARAMS))
    assert built == [], built


def test_an_option_this_xla_does_not_know_is_left_out_and_the_others_kept():
    """es.minimize's loop and the report's program pass XLA options that a later XLA may drop (jax 0.11 dropped
    the loop emitters' flag): ``compile_with`` compiles without the unknown ones, and raises other errors."""
    from es.engine.compiler import compile_with

    lowered = jax.jit(lambda x: x * 3).lower(jnp.float32(2))
    options = {"xla_not_an_option_of_any_xla": True, "xla_backend_optimization_level": 0}
    with pytest.raises(jax.errors.JaxRuntimeError, match="xla_not_an_option_of_any_xla"):
        lowered.compile(options)
    assert float(compile_with(lowered, options)(jnp.float32(2))) == 6.0
    with pytest.raises(jax.errors.JaxRuntimeError):  # a bad value of a known option is not an unknown option
        compile_with(lowered, {"xla_backend_optimization_level": "not a number"})
