"""exchange="sharded": each device rebuilds a slice of the coordinates of every member's noise, with the bits
of exchange="fitness" on 1, 2, 4 and 8 devices; what each mode moves and computes (es.exchange_report)."""

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import sphere
from test_strategies import STRATEGIES

import es
from es import engine
from es.layout import Layout
from es.noise import standard_normal

SOURCES = {"prng": es.GaussianNoise(), "table": es.NoiseTable(size=2**20, seed=2)}
MIN_SLICE = es.noise.MIN_SLICE


def odd_sized_params():
    """70,001 params in two leaves: on 8 devices slices of 8,751 (at least MIN_SLICE), the last one moved back."""
    return {"w": 0.1 * jax.random.normal(jax.random.key(3), (101, 693)), "b": jnp.linspace(-1.0, 1.0, 8)}


def noisy_fitness(params, key):
    """Non-linear in every leaf and uses its key, so every member gets a distinct fitness."""
    x = jnp.tanh(jnp.ones(101) @ params["w"]) + 0.1 * jax.random.normal(key, (693,))
    return -jnp.sum((x - 0.3) ** 2) - jnp.sum(params["b"] ** 2)


def evolve(strategy, params, num_devices, exchange, generations=2, fitness_fn=noisy_fitness):
    state = strategy.init(jax.random.key(0), params)
    return es.evolve(strategy, fitness_fn, state, generations, mesh=es.make_mesh(num_devices), exchange=exchange)


@functools.cache
def fitness_reference(name, source):
    """``exchange="fitness"`` on one device for odd-sized params: computed (and compiled) once per module."""
    strategy = dataclasses.replace(STRATEGIES[name], noise=SOURCES[source])
    return evolve(strategy, odd_sized_params(), 1, "fitness")


@pytest.mark.parametrize("dim", [1, 7, 1000, 100_003])
@pytest.mark.parametrize("start", [0, 3, 517])
def test_noise_slices_equal_the_same_coordinates_of_the_full_draw(dim, start):
    size = min(64, dim)
    start = min(start, dim - size)
    key = jax.random.key(5)
    full = jax.random.normal(key, (dim,))
    part = jax.jit(lambda s: standard_normal(key, dim, s, size))(jnp.int32(start))
    chex.assert_trees_all_equal(part, full[start:start + size])


@pytest.mark.parametrize("source", SOURCES.values(), ids=SOURCES.keys())
@pytest.mark.parametrize("squares", [False, True])
def test_sums_over_a_slice_are_the_bits_of_the_full_sums(source, squares):
    """Each coordinate is summed in member order whatever the slice (of MIN_SLICE or more): the bits of the whole."""
    dim = 3 * MIN_SLICE + 5
    layout = Layout(((dim,),))
    keys = jax.random.split(jax.random.key(0), 32)
    linear = jax.random.normal(jax.random.key(1), (32,))
    square = jax.random.normal(jax.random.key(2), (32,)) if squares else None
    aux = jax.jit(source.prepare, static_argnums=0)(layout)
    full = jax.jit(lambda: source.sums(aux, keys, linear, square, layout))()
    for size in (MIN_SLICE, MIN_SLICE + 3, 2 * MIN_SLICE):
        sums = jax.jit(lambda start, size=size: source.sums(aux, keys, linear, square, layout, start, size))
        for start in (0, 9, dim - size):
            part = sums(jnp.int32(start))
            chex.assert_trees_all_equal(part, jax.tree.map(lambda x, s=start, n=size: x[s:s + n], full))


# Every strategy with PRNG noise; the table with one strategy that gathers the linear sum alone (OpenES) and one
# that also gathers the squared sum (SNES): the noise source's slicing does not depend on the strategy otherwise.
SHARDED_CASES = [(name, "prng") for name in ("OpenES", "SNES", "PGPE", "ARS", "SepCMAES")] + [
    ("OpenES", "table"), ("SNES", "table")]


@pytest.mark.parametrize("name, source", SHARDED_CASES, ids=[f"{n}-{s}" for n, s in SHARDED_CASES])
def test_sharded_on_8_devices_is_fitness_bit_for_bit(name, source):
    """70,001 params, so the last slice on 8 devices overlaps the one before it."""
    strategy = dataclasses.replace(STRATEGIES[name], noise=SOURCES[source])
    chex.assert_trees_all_equal(evolve(strategy, odd_sized_params(), 8, "sharded"), fitness_reference(name, source))


# Each device count once: the linear sum alone (OpenES) on 1 and 2 devices, with the squared sum (SNES) on 4.
@pytest.mark.parametrize("name, device_counts", [("OpenES", (1, 2)), ("SNES", (4,))], ids=["OpenES", "SNES"])
def test_sharded_is_fitness_bit_for_bit_on_1_2_and_4_devices(name, device_counts):
    strategy = dataclasses.replace(STRATEGIES[name], noise=SOURCES["prng"])
    for num_devices in device_counts:
        chex.assert_trees_all_equal(
            evolve(strategy, odd_sized_params(), num_devices, "sharded"), fitness_reference(name, "prng"))


def test_sharded_with_fewer_than_min_slice_params_sums_everything_like_fitness():
    strategy = es.OpenES(popsize=16, sigma=0.1)
    params = jnp.linspace(-1.0, 1.0, 300)
    assert engine.slice_size(300, 8) == 300
    chex.assert_trees_all_equal(
        evolve(strategy, params, 8, "sharded", fitness_fn=sphere),
        evolve(strategy, params, 1, "fitness", fitness_fn=sphere),
    )


def test_slices_cover_every_coordinate_once_in_order():
    for dim in (MIN_SLICE + 1, 2 * MIN_SLICE, 8 * MIN_SLICE - 1, 8 * MIN_SLICE + 3, 70_001, 1_000_000):
        for n in (1, 2, 4, 8):
            size = engine.slice_size(dim, n)
            if size == dim:
                continue
            starts = [min(d * size, dim - size) for d in range(n)]
            gathered = np.concatenate([np.arange(s, s + size) for s in starts])
            order = engine.slice_order(dim, n)
            np.testing.assert_array_equal(gathered if order is None else gathered[order], np.arange(dim))


@pytest.mark.parametrize("name", ["OpenES", "SNES"])
def test_sharded_moves_the_fitnesses_and_one_slice_of_each_sum_per_device(name):
    """4 P + 4 n ceil(D / n) bytes for a mean-only strategy; SNES also gathers Sums.square: 8 n ceil(D / n)."""
    strategy = STRATEGIES[name]
    dim, n = 100_003, 8
    state = strategy.init(jax.random.key(0), jnp.zeros(dim))
    report = es.collectives_report(strategy, sphere, state, es.make_mesh(n), exchange="sharded")
    sums = 2 if strategy.uses_squares else 1
    assert engine.slice_size(dim, n) == 12_501
    expected = 4 * strategy.popsize + 4 * sums * n * 12_501
    assert report.total_bytes == expected, str(report)


def test_exchange_report_models_the_bytes_the_compiled_program_moves():
    strategy = es.OpenES(popsize=64, sigma=0.1)
    state = strategy.init(jax.random.key(0), jnp.zeros(100_003))
    report = es.exchange_report(strategy, sphere, state, es.make_mesh(8))
    assert report.auto == "sharded"
    costs = {c.mode: c for c in report.costs}
    assert set(costs) == {"fitness", "sharded", "gradient"}
    for cost in costs.values():
        assert cost.bytes == cost.measured_bytes, str(report)
    # the update's noise: every vector on every device, a 1/8 slice of each, or 1/8 of the vectors
    assert costs["fitness"].update_floats == 32 * 100_003
    assert costs["sharded"].update_floats == 32 * 12_501
    assert costs["gradient"].update_floats == 4 * 100_003
    assert costs["sharded"].bit_identical and not costs["gradient"].bit_identical
    assert "sharded" in str(report)


def test_auto_is_sharded_on_several_devices_else_fitness():
    params = jnp.zeros(3 * MIN_SLICE)
    strategy = es.OpenES(popsize=16, sigma=0.1, optimizer=optax.sgd(0.1))
    state = strategy.init(jax.random.key(0), params)
    for n, expected in ((1, "fitness"), (8, "sharded")):
        assert engine.check_evolve_args(strategy, sphere, state, 1, es.make_mesh(n), "auto")[1].exchange == expected
    small = strategy.init(jax.random.key(0), jnp.zeros(MIN_SLICE))  # one slice would be all of it
    assert engine.check_evolve_args(strategy, sphere, small, 1, es.make_mesh(8), "auto")[1].exchange == "fitness"
    low_rank = es.OpenES(popsize=16, noise=es.LowRankNoise())
    state = low_rank.init(jax.random.key(0), {"w": jnp.zeros((10, 30))})
    assert engine.check_evolve_args(low_rank, sphere, state, 1, es.make_mesh(8), "auto")[1].exchange == "fitness"
    # auto gives the bits of fitness
    chex.assert_trees_all_equal(
        evolve(strategy, params, 8, "auto", fitness_fn=sphere),
        evolve(strategy, params, 8, "fitness", fitness_fn=sphere),
    )


def test_sharded_with_low_rank_noise_is_refused_before_compiling():
    strategy = es.OpenES(popsize=16, noise=es.LowRankNoise())
    state = strategy.init(jax.random.key(0), {"w": jnp.zeros((10, 30))})
    with pytest.raises(ValueError, match=r"exchange='sharded'.*LowRankNoise.*use exchange='fitness'"):
        es.evolve(strategy, sphere, state, 1, mesh=es.make_mesh(8), exchange="sharded")


def test_an_unknown_exchange_mode_is_refused_naming_the_choices():
    strategy = es.OpenES(popsize=16)
    state = strategy.init(jax.random.key(0), jnp.zeros(10))
    with pytest.raises(ValueError, match=r"exchange='shard'.*'fitness', 'sharded', 'gradient', 'auto'"):
        es.evolve(strategy, sphere, state, 1, exchange="shard")
