"""Noise sources: exact N(0, 1) values, the member -> noise mapping, and what it costs in memory."""

import functools
import importlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.stats
from helpers import compiled_temp_bytes, rastrigin

import es
from es.engine import generation as engine
from es.engine import members as population
from es.fitness import JaxFitness
from es.engine.batching import default_eval_batch_size, default_update_batch_size, map_chunks
from es.noise import Layout
from es.noise import standard_normal

SOURCES = [es.GaussianNoise(), es.NoiseTable(size=4096, seed=3)]
SOURCE_IDS = ["prng", "table"]


@pytest.mark.parametrize("dim", [1, 7, 1000, 100_003])
def test_standard_normal_is_jax_random_normal_bit_for_bit(dim):
    keys = jax.random.split(jax.random.key(11), 3)
    ours = jax.jit(jax.vmap(lambda k: standard_normal(k, dim)))(keys)
    reference = jax.jit(jax.vmap(lambda k: jax.random.normal(k, (dim,))))(keys)
    chex.assert_trees_all_equal(ours, reference)


def test_standard_normal_accepts_raw_and_non_threefry_keys():
    raw = jax.random.PRNGKey(5)  # legacy uint32[2] key: threefry by default
    chex.assert_trees_all_equal(standard_normal(raw, 300), jax.random.normal(raw, (300,)))
    philox = jax.random.key(5, impl="philox4x32")  # falls back to jax.random.normal
    chex.assert_trees_all_equal(standard_normal(philox, 300), jax.random.normal(philox, (300,)))


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_a_generations_vector_keys_are_its_noise_keys_bit_for_bit(impl):
    """One unrolled hash of the counters (threefry), or ``noise_key`` vmapped (other key kinds): the same keys."""
    gen_key = population.generation_key(jax.random.key(3, impl=impl), jnp.int32(5))
    expected = jax.vmap(population.noise_key, in_axes=(None, 0))(gen_key, jnp.arange(37))
    np.testing.assert_array_equal(jax.random.key_data(population.vector_keys(gen_key, 37)),
                                  jax.random.key_data(expected))


def test_noise_table_is_jax_random_normal_of_its_seed():
    size = 2**16 + 1234  # built 2**16 values per step: a full row and a partial one
    table = jax.jit(es.NoiseTable(size=size, seed=9).prepare, static_argnums=0)(Layout(((10,),)))
    chex.assert_trees_all_equal(table, jax.random.normal(jax.random.key(9), (size,)))
    other = jax.jit(es.NoiseTable(size=size, seed=10).prepare, static_argnums=0)(Layout(((10,),)))
    assert not np.array_equal(np.asarray(table), np.asarray(other))


def _gaussian_samples(source, n):
    """``n`` noise values from ``source``: the table itself, or 64 vectors from distinct noise keys."""
    if isinstance(source, es.NoiseTable):
        return np.asarray(jax.jit(source.prepare, static_argnums=0)(Layout(((1,),))), np.float64)
    gen_key = population.generation_key(jax.random.key(0), jnp.int32(0))
    keys = jax.vmap(population.noise_key, in_axes=(None, 0))(gen_key, jnp.arange(64))
    draws = jax.jit(jax.vmap(lambda k: source.sample(None, k, Layout(((n // 64,),)))))(keys)
    return np.asarray(draws, np.float64).ravel()


@pytest.mark.parametrize("source", [es.GaussianNoise(), es.NoiseTable(size=2**20, seed=0)], ids=SOURCE_IDS)
def test_noise_values_are_standard_normal(source):
    """Moments and the KS distance of 2**20 samples against N(0, 1).

    Each tolerance is 5 standard errors of the statistic for n iid N(0, 1)
    samples (mean 1/sqrt(n), variance sqrt(2/n), skewness sqrt(6/n), excess
    kurtosis sqrt(24/n)); the KS bound is the asymptotic critical value at
    level 1e-6, sqrt(ln(2 / 1e-6) / (2n)). A sound generator fails one of
    these with probability about 1e-5; a wrong scale, shift or shape (e.g. a
    uniform, or a normal with variance 1.01) fails all of them.
    """
    x = _gaussian_samples(source, 2**20)
    n = x.size
    assert n == 2**20
    assert abs(x.mean()) < 5 / np.sqrt(n)
    assert abs(x.var() - 1.0) < 5 * np.sqrt(2 / n)
    assert abs(scipy.stats.skew(x)) < 5 * np.sqrt(6 / n)
    assert abs(scipy.stats.kurtosis(x)) < 5 * np.sqrt(24 / n)
    assert scipy.stats.kstest(x, "norm").statistic < np.sqrt(np.log(2 / 1e-6) / (2 * n))


def capture_members(popsize, dim):
    """A StatefulFitness whose state becomes the params of every member of the last generation."""
    return es.StatefulFitness(
        init=lambda: jnp.zeros((popsize, dim)),
        evaluate=lambda params, key, state: (-jnp.sum(params**2), params),
        update=lambda state, stats: stats,
    )


@pytest.mark.parametrize("source", SOURCES, ids=SOURCE_IDS)
@pytest.mark.slow
def test_antithetic_pairs_mirror_each_other_and_come_from_their_noise_key(source):
    popsize, dim = 16, 100
    strategy = es.OpenES(popsize=popsize, sigma=1.0, noise=source)
    fitness = capture_members(popsize, dim)
    key = jax.random.key(4)
    state = strategy.init(key, jnp.zeros(dim), fitness=fitness)
    state, _ = es.evolve(strategy, fitness, state, 1, mesh=es.make_mesh(4))
    members = np.asarray(state.fitness_state)  # theta = 0, sigma = 1: member i is sign_i * eps_i

    np.testing.assert_array_equal(members[0::2], -members[1::2])
    gen_key = population.generation_key(key, jnp.int32(0))
    for j in range(popsize // 2):
        noise_key = population.noise_key(gen_key, jnp.int32(j))
        if isinstance(source, es.NoiseTable):
            table = jax.random.normal(jax.random.key(source.seed), (source.size,))
            offset = int(source.offset(noise_key, dim))
            expected = table[offset : offset + dim]
        else:
            expected = jax.random.normal(noise_key, (dim,))
        np.testing.assert_array_equal(members[2 * j], np.asarray(expected))


def key_using_fitness(params, key):
    """Nonlinear in params and in the key, like a stochastic rollout."""
    x = jnp.tanh(params["w"] @ params["v"])
    return -jnp.sum((x - jax.random.normal(key, x.shape)) ** 2)


def evaluate_both_ways(params, sigma):
    """Members 0..23 evaluated drawing each pair's noise once, and drawing it per member."""
    strategy = es.OpenES(popsize=24, sigma=sigma)
    fitness = JaxFitness(
        es.StatefulFitness(init=lambda: (), evaluate=lambda p, k, s: (key_using_fitness(p, k), p), update=None)
    )
    gen_key = population.generation_key(jax.random.key(2), jnp.int32(5))
    members = jnp.arange(24, dtype=jnp.int32)

    @functools.partial(jax.jit, static_argnums=0)
    def evaluate(pairs):
        generation = population.Generation(strategy.noise, None, gen_key, params, jnp.float32(sigma), True,
                                          vectors=12)
        return map_chunks(lambda chunk: fitness.evaluate(generation, chunk, (), pairs), members, 6)

    return evaluate(True), evaluate(False)


def test_pair_evaluation_draws_exactly_the_per_member_noise():
    """theta = 0, sigma = 1: every member is exactly sign * eps, so the noise itself is compared."""
    zeros = {"w": jnp.zeros((6, 40)), "v": jnp.zeros((40, 3))}
    (pair_fitness, pair_members), (member_fitness, member_members) = evaluate_both_ways(zeros, 1.0)
    chex.assert_trees_all_equal(pair_members, member_members)
    chex.assert_trees_all_equal(pair_fitness, member_fitness)


def test_pair_evaluation_members_differ_from_per_member_ones_by_at_most_one_rounding():
    """theta + sigma * sign * eps: XLA may contract it into a fused multiply-add in one fusion and
    not in another, so the two paths may differ by one float32 rounding of the product. The
    path is chosen per (strategy, batch) and never depends on the mesh (next test), so this never
    affects bit-identity across device counts."""
    params = {"w": jnp.linspace(-1.0, 1.0, 6 * 40).reshape(6, 40), "v": jnp.ones((40, 3))}
    (pair_fitness, pair_members), (member_fitness, member_members) = evaluate_both_ways(params, 0.1)
    # |theta| <= 1 and |sigma * eps| < 1, so both the product and the sum lie below 2, where one
    # rounding moves a float32 by at most spacing(1) = 2**-23; the two paths round differently once.
    for a, b in zip(jax.tree.leaves(pair_members), jax.tree.leaves(member_members)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=2 * np.spacing(np.float32(1)))
    np.testing.assert_allclose(pair_fitness.value, member_fitness.value, rtol=1e-6)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("popsize", [2, 8, 16, 24, 48, 64, 96, 256, 1000, 1024, 4096])
@pytest.mark.parametrize("antithetic", [True, False])
def test_pair_evaluation_is_chosen_identically_on_1_2_4_8_devices(popsize, antithetic, backend, monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: backend)  # an accelerator's budget, 256x the CPU's
    strategy = es.OpenES(popsize=popsize, antithetic=antithetic)
    for dim in (10, 1000, 100_000, 1_000_000):
        batch = default_eval_batch_size(popsize, dim, antithetic)
        devices = [n for n in (1, 2, 4, 8) if popsize % n == 0]
        assert all((popsize // n) % batch == 0 for n in devices)  # every micro-batch is full
        choices = {engine.evaluates_pairs(strategy, popsize // n, batch) for n in devices}
        assert len(choices) == 1, (popsize, dim, batch)
        if antithetic and batch % 2 == 0:
            assert choices == {True}


def test_an_accelerator_takes_batches_as_large_as_its_budget_where_a_cpu_keeps_cache_sized_ones(monkeypatch):
    """At 1e6 params and popsize 1,024 (antithetic): on a CPU, a pair per evaluation batch and 16 vectors per
    step of the sum (2**19 floats, and the sum's floor); on a GPU or TPU, 2**27 floats: 128 members (the
    largest even divisor of 1,024 / 8 within 134) and 134 vectors per step."""
    sizes = {}
    for backend in ("cpu", "gpu", "tpu"):
        monkeypatch.setattr(jax, "default_backend", lambda backend=backend: backend)
        sizes[backend] = default_eval_batch_size(1024, 1_000_000, True), default_update_batch_size(1_000_000)
    assert sizes == {"cpu": (2, 16), "gpu": (128, 134), "tpu": (128, 134)}


def run(strategy, fitness_fn, params, generations, num_devices):
    state = strategy.init(jax.random.key(0), params)
    return es.evolve(strategy, fitness_fn, state, generations, mesh=es.make_mesh(num_devices))


@pytest.mark.slow
def test_noise_table_learns_like_fresh_noise():
    strategy = es.OpenES(popsize=64, sigma=0.05, optimizer=optax.adam(0.05), noise=es.NoiseTable(size=20_000, seed=0))
    start = jnp.ones(100)
    state, _ = run(strategy, lambda x, k: -jnp.sum(x**2), start, 100, num_devices=2)
    assert float(jnp.sum(state.params**2)) < float(jnp.sum(start**2)) / 10


def sums_inputs(dim, count):
    """A layout of ``dim`` params and the noise keys and linear and squared coefficients of ``count`` members."""
    keys = jax.vmap(population.noise_key, in_axes=(None, 0))(jax.random.key(4), jnp.arange(count))
    return es.Layout.of(jnp.zeros(dim)), keys, jnp.linspace(-1.0, 1.0, count), jnp.linspace(0.5, 2.0, count)


@pytest.mark.parametrize("dim", [1000, es.noise.MIN_SLICE + 1])  # fused reductions, then a loop
@pytest.mark.parametrize("source", [es.GaussianNoise(), es.NoiseTable(size=2**18, seed=3)], ids=SOURCE_IDS)
@pytest.mark.slow
def test_sums_are_the_weighted_sums_of_the_samples_and_their_squares(source, dim):
    layout, keys, linear, square = sums_inputs(dim, 7)
    aux = source.prepare(layout)
    eps = np.asarray(jax.vmap(source.sample, in_axes=(None, 0, None))(aux, keys, layout), np.float64)
    total, total_square = jax.jit(source.sums, static_argnums=4)(aux, keys, linear, square, layout)
    only_linear, none = jax.jit(source.sums, static_argnums=4)(aux, keys, linear, None, layout)
    np.testing.assert_allclose(total, np.asarray(linear) @ eps, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(total_square, np.asarray(square) @ eps**2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(only_linear, total, rtol=1e-6, atol=1e-6)
    assert none is None


def test_unroll_set_on_its_module_changes_the_program_and_not_the_bits(monkeypatch):
    """``UNROLL`` is read from ``es.noise.accumulate``'s module when a program is traced (``es.noise.UNROLL``
    is a copy, and ``es.noise.accumulate`` the function): each value compiles its own loop, with the same sums."""
    module = importlib.import_module("es.noise.accumulate")
    layout, keys, linear, square = sums_inputs(es.noise.MIN_SLICE + 3, 16)
    source = es.GaussianNoise()

    def compiled_sums(unroll):
        monkeypatch.setattr(module, "UNROLL", unroll)
        compiled = jax.jit(lambda k, a, b: source.sums(None, k, a, b, layout)).lower(keys, linear, square).compile()
        return compiled.as_text().count(" xor("), compiled(keys, linear, square)

    (size_1, sums_1), (size_8, sums_8) = compiled_sums(1), compiled_sums(8)
    assert size_8 > 4 * size_1  # the threefry hash of eight draws per loop step instead of one
    chex.assert_trees_all_equal(sums_8, sums_1)


@pytest.mark.parametrize("source", SOURCES[:1] + [es.NoiseTable(size=2**16)], ids=SOURCE_IDS)
@pytest.mark.slow
def test_compiled_memory_is_flat_in_popsize(source):
    """XLA's temporary buffers grow by O(1) bytes per member, never by a perturbation (4 * dim bytes).

    Read from the compiled program's memory analysis, for popsizes at which
    the evaluation micro-batch has already reached its (popsize-independent)
    budget.
    """
    dim = 20_000

    def temp_bytes(popsize):
        strategy = es.OpenES(popsize=popsize, noise=source)
        state = strategy.init(jax.random.key(0), jnp.ones(dim))
        evolve = jax.jit(lambda s: es.evolve(strategy, rastrigin, s, 1, mesh=es.make_mesh(1)))
        return compiled_temp_bytes(evolve.lower(state))

    small, large = temp_bytes(512), temp_bytes(4096)
    assert large - small < 64 * (4096 - 512), (small, large)  # 64 B/member; a perturbation is 80,000 B
    assert large < 4096 * dim * 4 / 50  # under 2% of a materialised population


def test_noise_table_validation_is_clear():
    with pytest.raises(ValueError, match=r"NoiseTable\(size=100\) is smaller than the 1000 parameters"):
        strategy = es.OpenES(popsize=8, noise=es.NoiseTable(size=100))
        es.evolve(strategy, rastrigin, strategy.init(jax.random.key(0), jnp.ones(1000)), 1)
    for size in (0, -5, 2**31, 1.5, True):
        with pytest.raises(ValueError, match="size must be an int"):
            es.NoiseTable(size=size)
    with pytest.raises(TypeError, match="seed must be an int"):
        es.NoiseTable(seed=0.5)
