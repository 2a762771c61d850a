"""Exchange modes: "gradient" all-reduces a params-sized sum, "fitness" gathers popsize scalars.

Both compute the same estimate; they differ only in the order of the float
additions of the weighted noise sum, which for "gradient" depends on how the
population is split over devices.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import rastrigin, sphere

import es

SOURCES = [es.GaussianNoise(), es.NoiseTable(size=8192, seed=2)]
SOURCE_IDS = ["prng", "table"]


def run(mode, params, generations, num_devices):
    strategy, exchange = mode
    state = strategy.init(jax.random.key(1), params)
    return es.evolve(strategy, rastrigin, state, generations, mesh=es.make_mesh(num_devices), exchange=exchange)


def strategies(**kwargs):
    """``(strategy, exchange)`` of the same OpenES in "fitness" and "gradient" mode."""
    strategy = es.OpenES(popsize=64, sigma=0.1, optimizer=optax.sgd(0.01), **kwargs)
    return (strategy, "fitness"), (strategy, "gradient")


@pytest.mark.parametrize("source", SOURCES, ids=SOURCE_IDS)
@pytest.mark.slow
def test_gradient_and_fitness_exchange_agree_up_to_float_rounding(source):
    """One generation from the same state: same fitnesses, same update up to float32 rounding.

    The gradient is a sum of 32 weighted noise vectors; regrouping those
    additions changes each coordinate by a few ulps of the running sum, so the
    estimates agree to ~1e-6 relative (asserted: 1e-5). Only one generation is
    compared: later generations evaluate slightly different means, and a
    centered-rank tie can then flip, which is a legitimate divergence.
    """
    fitness_mode, gradient_mode = strategies(noise=source)
    params = jnp.linspace(-2.0, 2.0, 300)
    (f_state, f_metrics), (g_state, g_metrics) = (run(s, params, 1, 8) for s in (fitness_mode, gradient_mode))
    chex.assert_trees_all_equal(f_metrics["fitness_mean"], g_metrics["fitness_mean"])  # same members
    step = np.asarray(f_state.params - params)
    np.testing.assert_allclose(np.asarray(g_state.params - params), step, rtol=1e-5, atol=1e-5 * np.abs(step).max())
    np.testing.assert_allclose(g_metrics["grad_norm"], f_metrics["grad_norm"], rtol=1e-5)


@pytest.mark.slow
def test_gradient_exchange_on_one_device_is_the_fitness_computation():
    """With every member local, both modes sum the same chunks in the same order: bit-identical."""
    fitness_mode, gradient_mode = strategies(antithetic=False, fitness_shaping="z_score")
    params = jnp.linspace(-2.0, 2.0, 300)
    chex.assert_trees_all_equal(run(fitness_mode, params, 3, 1), run(gradient_mode, params, 3, 1))


@pytest.mark.slow
def test_fitness_exchange_is_bit_identical_across_device_counts_and_gradient_is_close():
    fitness_mode, gradient_mode = strategies()
    params = jnp.linspace(-2.0, 2.0, 300)
    chex.assert_trees_all_equal(run(fitness_mode, params, 2, 8), run(fitness_mode, params, 2, 1))
    # "gradient" sums per device, then across devices: the same terms in another order.
    one, eight = run(gradient_mode, params, 2, 1)[0], run(gradient_mode, params, 2, 8)[0]
    np.testing.assert_allclose(np.asarray(eight.params), np.asarray(one.params), rtol=1e-5)


@pytest.mark.slow
def test_bytes_per_generation_of_each_exchange_mode_with_the_noise_table():
    """"fitness": popsize floats (the table is never sent). "gradient": that plus one params-sized vector."""
    popsize, dim, slack = 64, 5_000, 64
    fitness_mode, gradient_mode = strategies(noise=SOURCES[1])
    state = fitness_mode[0].init(jax.random.key(0), jnp.zeros(dim))
    mesh = es.make_mesh(8)
    fitness_report = es.collectives_report(fitness_mode[0], sphere, state, mesh, exchange="fitness")
    gradient_report = es.collectives_report(gradient_mode[0], sphere, state, mesh, exchange="gradient")
    assert fitness_report.total_bytes <= 4 * popsize + slack, str(fitness_report)
    assert 4 * dim <= gradient_report.total_bytes <= 4 * (popsize + dim) + slack, str(gradient_report)
    assert "all-reduce" in {c.op for c in gradient_report.crossing}
