"""es.LowRankNoise: rank-r perturbations of matrix leaves (EGGROLL), materialised or factored (es.LowRank,
es.matmul); bit-identical across device counts, the same fitness either way, and refused where unsound."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import compiled_temp_bytes, programs_built, sphere

import es
from es.engine import execution
from es.engine import members as population
from es.noise import Layout
from es.noise import standard_normal


def mlp_params(key=jax.random.key(1)):
    k1, k2 = jax.random.split(key)
    return {
        "w1": 0.3 * jax.random.normal(k1, (6, 16)),
        "b1": jnp.zeros(16),
        "w2": 0.3 * jax.random.normal(k2, (16, 4)),
    }


def mlp_fitness(params, key):
    """A two-layer network on a batch of inputs, written with es.matmul; uses its key."""
    x = jnp.linspace(-1.0, 1.0, 18).reshape(3, 6)
    hidden = jnp.tanh(es.matmul(x, params["w1"]) + params["b1"])
    out = es.matmul(hidden, params["w2"])
    return -jnp.mean((out - 0.5) ** 2) + 0.01 * jax.random.normal(key)


LOW_RANK_STRATEGIES = {
    "OpenES": lambda noise: es.OpenES(popsize=32, sigma=0.1, optimizer=optax.adam(0.05), noise=noise),
    "ARS": lambda noise: es.ARS(popsize=32, sigma=0.1, top_k=8, learning_rate=0.05, noise=noise),
    "PGPE": lambda noise: es.PGPE(popsize=32, sigma=0.1, sigma_learning_rate=0.0, noise=noise),
}


def evolve(strategy, generations, num_devices, fitness_fn=mlp_fitness, params=None):
    state = strategy.init(jax.random.key(0), mlp_params() if params is None else params)
    return es.evolve(strategy, fitness_fn, state, generations, mesh=es.make_mesh(num_devices))


def test_a_matrix_leaf_gets_A_B_transposed_over_sqrt_r_and_a_vector_leaf_gaussian_noise():
    """The draw is one standard_normal of (m + n) r per matrix plus the vector sizes, split in leaf order."""
    noise = es.LowRankNoise(rank=3)
    params = {"a": jnp.zeros((2, 5, 4)), "b": jnp.zeros(7)}  # "a" is viewed as the matrix [10, 4]
    layout = Layout.of(params)
    key = jax.random.key(9)
    eps = jax.jit(noise.sample, static_argnums=2)(None, key, layout)
    z = np.asarray(standard_normal(key, (10 + 4) * 3 + 7), np.float64)
    assert noise.draw_size(layout) == z.size
    a, b = z[:30].reshape(10, 3), z[30:42].reshape(4, 3)
    np.testing.assert_allclose(np.asarray(eps[:40]), (a @ b.T / np.sqrt(3)).ravel(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(eps[40:]), z[42:].astype(np.float32))


def test_low_rank_entries_have_unit_variance_so_sigma_keeps_its_meaning():
    noise = es.LowRankNoise(rank=4)
    layout = Layout(((64, 64),))
    keys = jax.random.split(jax.random.key(0), 64)
    eps = np.asarray(jax.jit(jax.vmap(lambda k: noise.sample(None, k, layout)))(keys), np.float64)
    assert abs(eps.mean()) < 0.02
    assert abs(eps.var() - 1.0) < 0.05  # 64 draws x 4096 entries; the entries of one draw are correlated


@pytest.mark.slow
def test_the_update_sum_is_the_sum_of_the_members_perturbations():
    """One matrix product per chunk of members equals adding c_i * A_i B_i^T / sqrt(r) member by member."""
    noise = es.LowRankNoise(rank=2)
    layout = Layout.of(mlp_params())
    keys = jax.random.split(jax.random.key(0), 12)
    linear = jax.random.normal(jax.random.key(1), (12,))
    total, square = jax.jit(lambda: noise.sums(None, keys, linear, None, layout))()
    assert square is None
    eps = jax.vmap(lambda k: noise.sample(None, k, layout))(keys)
    np.testing.assert_allclose(np.asarray(total), np.asarray(linear @ eps), rtol=1e-4, atol=1e-5)


def test_the_update_is_one_matrix_product_per_chunk_never_one_per_member():
    strategy = LOW_RANK_STRATEGIES["OpenES"](es.LowRankNoise())
    state = strategy.init(jax.random.key(0), {"w": jnp.zeros((40, 50))})
    jaxpr = str(jax.make_jaxpr(lambda s: es.evolve(strategy, sphere, s, 1, mesh=es.make_mesh(1)))(state))
    # the update: dot_general contracting members and rank ([16, 40, 1] x [16, 50, 1] -> [40, 50])
    assert "dimension_numbers=(([0, 2], [0, 2]), ([], []))" in jaxpr


@pytest.mark.parametrize("rank", [1, 3])
@pytest.mark.slow
def test_factored_and_materialised_give_the_same_fitness_within_float_tolerance(rank):
    materialised = es.OpenES(popsize=32, sigma=0.1, noise=es.LowRankNoise(rank=rank))
    factored = es.OpenES(popsize=32, sigma=0.1, noise=es.LowRankNoise(rank=rank, factored=True))
    (state_m, metrics_m), (state_f, metrics_f) = evolve(materialised, 5, 2), evolve(factored, 5, 2)
    for name in ("fitness_mean", "fitness_max", "fitness_min"):
        np.testing.assert_allclose(metrics_f[name], metrics_m[name], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(state_f.params), jax.tree.leaves(state_m.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_factored_members_share_the_unbatched_base_and_materialise_to_the_members():
    params = mlp_params()
    noise = es.LowRankNoise(rank=2, factored=True)
    generation = population.Generation(noise, None, jax.random.key(3), params, jnp.float32(0.1), True, vectors=2)
    chunk = jnp.arange(4, dtype=jnp.int32)
    inputs, axes = generation.fitness_inputs(chunk)
    assert isinstance(inputs["w1"], es.LowRank) and axes["w1"] == es.LowRank(None, (0, 0), 0)
    assert inputs["w1"].base is params["w1"]  # not copied per member: one product with it for all of them
    assert inputs["w1"].factors[0].shape == (4, 6, 2) and inputs["w1"].factors[1].shape == (4, 16, 2)
    assert axes["b1"] == 0 and inputs["b1"].shape == (4, 16)
    materialised = generation.members(chunk)
    for i in range(4):
        member = jax.tree.map(lambda x, a: x if a is None else x[i], inputs["w1"], axes["w1"])
        np.testing.assert_allclose(np.asarray(member.materialise()), np.asarray(materialised["w1"][i]), atol=1e-6)
    np.testing.assert_array_equal(np.asarray(materialised["b1"]), np.asarray(inputs["b1"]))


def test_matmul_is_x_at_w_for_arrays_and_the_factored_product_for_low_rank():
    x = jax.random.normal(jax.random.key(0), (5, 6))
    w = jax.random.normal(jax.random.key(1), (6, 3))
    chex.assert_trees_all_equal(es.matmul(x, w), x @ w)
    a, b = jax.random.normal(jax.random.key(2), (6, 2)), jax.random.normal(jax.random.key(3), (3, 2))
    low_rank = es.LowRank(w, (a, b), jnp.float32(0.5))
    np.testing.assert_allclose(np.asarray(es.matmul(x, low_rank)), np.asarray(x @ (w + 0.5 * a @ b.T)), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(es.materialise(low_rank)), np.asarray(w + 0.5 * a @ b.T), rtol=1e-6)
    conv = es.LowRank(jnp.zeros((3, 3, 6)), (jnp.zeros((9, 1)), jnp.zeros((6, 1))), jnp.float32(1.0))
    with pytest.raises(ValueError, match=r"not a matrix.*materialise"):
        es.matmul(x, conv)


@pytest.mark.slow
def test_low_rank_learns_a_small_regression():
    strategy = LOW_RANK_STRATEGIES["OpenES"](es.LowRankNoise(rank=1, factored=True))
    state, metrics = evolve(strategy, 60, 2)
    assert float(metrics["fitness_mean"][-1]) > 2 * float(metrics["fitness_mean"][0])  # fitness < 0: closer to 0


@pytest.mark.parametrize("make, fragment", [
    (lambda noise: es.SNES(popsize=16, noise=noise), r"SNES adapts a variance per coordinate.*not independent"),
    (lambda noise: es.SepCMAES(popsize=16, noise=noise), r"SepCMAES adapts a variance per coordinate"),
    (lambda noise: es.PGPE(popsize=16, noise=noise), r"PGPE.*sigma_learning_rate=0"),
])
def test_strategies_that_adapt_per_coordinate_variances_refuse_low_rank_noise(make, fragment):
    with pytest.raises(ValueError, match=fragment):
        make(es.LowRankNoise())
    make(es.GaussianNoise())  # fine with full-rank noise


def test_low_rank_noise_on_params_without_a_matrix_is_refused_before_compiling():
    strategy = es.OpenES(popsize=16, noise=es.LowRankNoise())
    state = strategy.init(jax.random.key(0), {"b": jnp.zeros(8), "c": jnp.zeros(())})
    with programs_built() as built:
        for call in (lambda: es.evolve(strategy, sphere, state, 1), lambda: es.ask(strategy, state)):
            with pytest.raises(ValueError, match=r"LowRankNoise\(.*no leaf with two or more axes.*\[\(8,\), \(\)\]"
                                                 r".*use noise=es.GaussianNoise\(\)"):
                call()
    assert built == [], built


def test_bad_low_rank_settings_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match=r"LowRankNoise\(rank=0\): rank must be at least 1"):
        es.LowRankNoise(rank=0)
    with pytest.raises(TypeError, match=r"LowRankNoise\(rank=1.5\)"):
        es.LowRankNoise(rank=1.5)
    with pytest.raises(TypeError, match=r"LowRankNoise\(factored=1\): factored must be True or False"):
        es.LowRankNoise(factored=1)


def test_a_factored_fitness_that_multiplies_with_at_is_refused_with_the_fix():
    strategy = es.OpenES(popsize=16, noise=es.LowRankNoise(factored=True))
    state = strategy.init(jax.random.key(0), mlp_params())

    def plain(params, key):
        return -jnp.sum((jnp.ones(6) @ params["w1"]) ** 2)

    with pytest.raises(TypeError, match=r"es\.LowRank.*es\.matmul\(x, w\)"):
        es.evolve(strategy, plain, state, 1)


def test_factored_noise_needs_one_scale_per_member():
    """A strategy whose scale is per coordinate cannot keep A B^T factored (a custom strategy here)."""

    class PerCoordinate(es.OpenES):
        def scale(self, hp, strategy_state, generation):
            return jnp.full((6 * 16 + 16 + 16 * 4,), 0.1, jnp.float32)

    strategy = PerCoordinate(popsize=16, noise=es.LowRankNoise(factored=True))
    state = strategy.init(jax.random.key(0), mlp_params())
    with pytest.raises(ValueError, match=r"one scale per member.*factored=False"):
        es.evolve(strategy, mlp_fitness, state, 1)


@pytest.mark.slow
def test_compiled_memory_is_flat_in_popsize_with_low_rank_noise():
    """XLA's temporary buffers grow by O(1) bytes per member, never by a perturbation (4 * D bytes)."""
    params = {"w": jnp.ones((100, 200))}

    def temp_bytes(popsize, factored):
        strategy = es.OpenES(popsize=popsize, noise=es.LowRankNoise(factored=factored))
        state = strategy.init(jax.random.key(0), params)
        fitness = lambda p, k: -jnp.sum(es.matmul(jnp.ones((2, 100)), p["w"]) ** 2)  # noqa: E731
        evolve = jax.jit(lambda s: es.evolve(strategy, fitness, s, 1, mesh=es.make_mesh(1)))
        return compiled_temp_bytes(evolve.lower(state))

    for factored in (False, True):  # popsizes where the update's chunk (2**19 // draw_size vectors) is full
        small, large = temp_bytes(4096, factored), temp_bytes(16384, factored)
        assert large - small < 64 * (16384 - 4096), (factored, small, large)  # a perturbation is 80,000 B
        assert large < 16384 * 20_000 * 4 / 50  # under 2% of a materialised population


def test_ask_gives_materialised_members_with_factored_noise():
    strategy = es.OpenES(popsize=8, sigma=0.1, noise=es.LowRankNoise(factored=True))
    state = strategy.init(jax.random.key(0), mlp_params())
    members = es.ask(strategy, state)
    assert members["w1"].shape == (8, 6, 16)
    state_m = es.OpenES(popsize=8, sigma=0.1, noise=es.LowRankNoise()).init(jax.random.key(0), mlp_params())
    chex.assert_trees_all_equal(members, es.ask(es.OpenES(popsize=8, sigma=0.1, noise=es.LowRankNoise()), state_m))
    assert execution.resolve_execution(strategy, Layout.of(mlp_params()), "fitness", None, None).update_batch_size >= 16
