"""exchange="sharded": each device rebuilds a slice of the coordinates of every member's noise, with the bits
of exchange="fitness" on 1, 2, 4 and 8 devices; what each mode moves and computes (es.exchange_report)."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import STRATEGIES, sphere

import es
from es.engine import evolution, execution
from es.engine.partition import Partition, slice_size
from es.noise import Layout, standard_normal
from jax.sharding import PartitionSpec as P

pytestmark = pytest.mark.slow  # make test-fast leaves it out: programs of 70,001 and 100,000 params on 8 devices

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


def test_sharded_with_fewer_than_min_slice_params_sums_everything_like_fitness():
    strategy = es.OpenES(popsize=16, sigma=0.1)
    params = jnp.linspace(-1.0, 1.0, 300)
    assert slice_size(300, 8) == 300
    chex.assert_trees_all_equal(
        evolve(strategy, params, 8, "sharded", fitness_fn=sphere),
        evolve(strategy, params, 1, "fitness", fitness_fn=sphere),
    )


@pytest.mark.parametrize("align", [1, es.engine.partition.BLOCK])
def test_slices_cover_every_coordinate_once_in_order(align):
    for dim in (MIN_SLICE + 1, 2 * MIN_SLICE, 8 * MIN_SLICE - 1, 8 * MIN_SLICE + 3, 70_001, 1_000_000):
        for n in (1, 2, 4, 8):
            part = Partition(dim, n, align)
            if not part.split:
                continue
            assert part.size % align == 0 and part.size >= MIN_SLICE
            gathered = np.concatenate([np.arange(part.start(d), part.start(d) + part.size) for d in range(n)])
            np.testing.assert_array_equal(part.assemble(gathered), np.arange(dim))


def test_block_sums_of_stacked_vectors_are_each_vectors_own_bits():
    """The update sums its four norms' blocks in one program part: each row has the bits it has alone."""
    for dim in (10, 3 * es.engine.partition.BLOCK + 7):
        rows = jax.random.normal(jax.random.key(dim), (4, dim)) * 3.0
        together = jax.jit(es.engine.partition.block_square_sums)(rows)
        for row, sums in zip(rows, together):
            alone = jax.jit(es.engine.partition.block_square_sums)(row)
            assert np.asarray(sums).tobytes() == np.asarray(alone).tobytes(), dim


def test_norm_summed_by_owned_blocks_on_any_mesh_is_the_norm_of_the_whole():
    """What a device with a coordinatewise update sums (the blocks it owns), gathered: the bits of one device."""
    dim = 70_001
    x = jax.random.normal(jax.random.key(0), (dim,)) * jnp.exp(jax.random.normal(jax.random.key(1), (dim,)))
    whole = jax.jit(es.engine.partition.norm)(x)
    np.testing.assert_allclose(whole, jnp.linalg.norm(x), rtol=1e-6)
    for n in (2, 4, 8):
        part, mesh = Partition(dim, n, es.engine.partition.BLOCK), es.make_mesh(n)

        def from_blocks(x, part=part, mesh=mesh):
            device = jax.lax.axis_index(mesh.axis_names)
            own = jax.lax.dynamic_slice(x, (part.start(device),), (part.size,))
            blocks = jax.lax.all_gather(part.owned_block_sums(device, own), mesh.axis_names, tiled=True)
            return es.engine.partition.norm_from_block_sums(blocks, dim)

        sharded = jax.jit(jax.shard_map(from_blocks, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False))
        assert np.asarray(sharded(x)).tobytes() == np.asarray(whole).tobytes(), n


@pytest.mark.parametrize("strategy", [STRATEGIES["OpenES"], es.SepCMAES(popsize=32)], ids=["OpenES", "SepCMAES"])
def test_sharded_moves_the_fitnesses_and_one_slice_of_each_sum_per_device(strategy):
    """4 P + 4 n ceil(D / n) bytes for a mean-only strategy; SepCMAES also gathers Sums.square: 8 n ceil(D / n).

    (Neither is coordinatewise: this OpenES's optax.adam was not built by es.optimizers.make.)"""
    dim, n = 100_003, 8
    assert not strategy.coordinatewise
    state = strategy.init(jax.random.key(0), jnp.zeros(dim))
    report = es.collectives_report(strategy, sphere, state, es.make_mesh(n), exchange="sharded")
    hp = strategy.hyperparameters(dim)
    fitness = jax.ShapeDtypeStruct((strategy.popsize,), jnp.float32)
    squares = jax.eval_shape(lambda f: strategy.coefficients(hp, state.strategy_state, f), fitness).square
    sums = 2 if squares is not None else 1
    assert slice_size(dim, n) == 12_501
    expected = 4 * strategy.popsize + 4 * sums * n * 12_501
    assert report.total_bytes == expected, str(report)


# A coordinatewise update (es/engine/update.py): each device updates its slice, keeps its slice of the optimizer
# state and best params, and gathers the new mean (and SNES's sigma). tests/test_invariance.py runs each strategy
# that has one with PRNG noise on 8 devices, and the table with the two kinds of state (a private optimizer
# state, a shared sigma), against exchange="fitness" on one device.
COORDINATEWISE = {
    "OpenES": es.OpenES(popsize=32, sigma=0.1, optimizer=es.optimizers.make("adam", learning_rate=0.05),
                        weight_decay=0.01),
    "SNES": STRATEGIES["SNES"],
    "ARS": STRATEGIES["ARS"],
    "PGPE": es.PGPE(popsize=32, sigma=0.3, optimizer=es.optimizers.make("sgd", learning_rate=0.1, momentum=0.9)),
}

def test_each_device_carries_only_its_slice_of_the_optimizer_state_and_best_params():
    strategy = COORDINATEWISE["OpenES"]
    state = strategy.init(jax.random.key(0), odd_sized_params())
    mesh = es.make_mesh(8)
    _, resolved = execution.check_evolve_args(strategy, es.fitness.adapter(noisy_fitness), state, 1, mesh, "sharded")
    run = functools.partial(evolution.run_generations, strategy.program(), es.fitness.adapter(noisy_fitness), mesh,
                            resolved, 2, gather=False)
    hp = strategy.hyperparameters(70_001)
    carry, _ = jax.eval_shape(evolution.shard_replicated(run, mesh), hp, state)  # one device's carry
    size = Partition(70_001, 8, es.engine.partition.BLOCK).size
    assert size == 9_216 and carry.best_params.shape == (size,)
    adam = carry.strategy_state.opt_state[0]
    assert adam.mu.shape == adam.nu.shape == (size,)
    assert jax.tree.structure(carry.params) == jax.tree.structure(state.params)  # the mean stays whole
    final, _ = evolve(strategy, odd_sized_params(), 8, "sharded")
    chex.assert_trees_all_equal_shapes(final, state)  # gathered back at the end of the call


def test_sharded_coordinatewise_update_gathers_the_new_mean_instead_of_the_sums():
    """OpenES: the new mean's slices, 4 n S bytes, plus the norms' block sums; SNES also its sigma's slices."""
    dim, n = 100_003, 8
    size = Partition(dim, n, es.engine.partition.BLOCK).size
    assert size == 13 * 1024
    blocks = 4 * n * (4 * 13 + 1)
    for name, vectors in (("OpenES", 1), ("SNES", 2)):
        strategy = COORDINATEWISE[name]
        state = strategy.init(jax.random.key(0), jnp.zeros(dim))
        report = es.exchange_report(strategy, sphere, state, es.make_mesh(n))
        sharded = {c.mode: c for c in report.costs}["sharded"]
        assert sharded.bytes == sharded.measured_bytes == 4 * strategy.popsize + 4 * vectors * n * size + blocks
        assert report.update_coordinates == size
    # once per evolve call: Adam's two moments and the best params
    assert sharded.bytes_per_call == 4 * n * size and (
        {c.mode: c for c in es.exchange_report(COORDINATEWISE["OpenES"], sphere, COORDINATEWISE["OpenES"].init(
            jax.random.key(0), jnp.zeros(dim)), es.make_mesh(n), measure=False).costs}["sharded"].bytes_per_call
        == 3 * 4 * n * size)


def test_sharded_coordinatewise_update_drops_a_generation_without_valid_members_like_fitness():
    strategy = COORDINATEWISE["OpenES"]
    state = strategy.init(jax.random.key(0), odd_sized_params())
    start, _ = es.evolve(strategy, noisy_fitness, state, 1, mesh=es.make_mesh(8), exchange="sharded")

    def all_nan(params, key):
        return jnp.nan * noisy_fitness(params, key)

    after, metrics = es.evolve(strategy, all_nan, start, 1, mesh=es.make_mesh(8), exchange="sharded")
    chex.assert_trees_all_equal(after.params, start.params)
    chex.assert_trees_all_equal(after.strategy_state, start.strategy_state)
    assert int(metrics["num_invalid"][0]) == strategy.popsize
    reference, reference_metrics = es.evolve(strategy, all_nan, start, 1, mesh=es.make_mesh(1))
    chex.assert_trees_all_equal((after, metrics), (reference, reference_metrics))


def test_which_strategies_update_coordinatewise():
    assert es.OpenES(popsize=8).coordinatewise  # the default Adam, built by es.optimizers.make
    assert not es.OpenES(popsize=8, optimizer=optax.adam(0.01)).coordinatewise  # opaque: run whole
    assert es.OpenES(popsize=8, optimizer=es.optimizers.coordinatewise(optax.adam(0.01))).coordinatewise  # declared
    assert not es.OpenES(popsize=8, optimizer=es.optimizers.make("clipup", learning_rate=0.1, max_speed=0.2)
                         ).coordinatewise  # normalised by the norm over all coordinates
    assert not es.PGPE(popsize=8).coordinatewise  # ClipUp by default
    assert es.SNES(popsize=8).coordinatewise and es.ARS(popsize=8).coordinatewise
    assert not es.SepCMAES(popsize=8).coordinatewise  # its step size follows the norm of a path
    assert not es.optimizers.is_coordinatewise(es.optimizers.make("adamw", learning_rate=0.1, mask={"w": True}))


@pytest.mark.parametrize("strategy, size", [(STRATEGIES["OpenES"], 12_501), (COORDINATEWISE["OpenES"], 13_312)],
                         ids=["sums", "coordinatewise"])
def test_exchange_report_models_the_bytes_the_compiled_program_moves(strategy, size):
    """Slices of ceil(D / n) coordinates, or of a multiple of 1,024 for a coordinatewise update (es's Adam; the
    programs of test_sharded_coordinatewise_update_gathers_the_new_mean_instead_of_the_sums's OpenES)."""
    state = strategy.init(jax.random.key(0), jnp.zeros(100_003))
    report = es.exchange_report(strategy, sphere, state, es.make_mesh(8))
    assert report.auto == "sharded"
    costs = {c.mode: c for c in report.costs}
    assert set(costs) == {"fitness", "sharded", "gradient"}
    for cost in costs.values():
        assert cost.bytes == cost.measured_bytes, str(report)
    # the update's noise: every vector on every device, a 1/8 slice of each, or 1/8 of the vectors
    vectors = strategy.popsize // 2
    assert costs["fitness"].update_floats == vectors * 100_003
    assert costs["sharded"].update_floats == vectors * size
    assert costs["gradient"].update_floats == vectors // 8 * 100_003
    assert costs["sharded"].bit_identical and not costs["gradient"].bit_identical
    assert "sharded" in str(report)


def test_auto_is_sharded_on_several_devices_else_fitness():
    params = jnp.zeros(3 * MIN_SLICE)
    strategy = es.OpenES(popsize=16, sigma=0.1, optimizer=optax.sgd(0.1))
    state = strategy.init(jax.random.key(0), params)
    for n, expected in ((1, "fitness"), (8, "sharded")):
        assert execution.check_evolve_args(strategy, es.fitness.adapter(sphere), state, 1, es.make_mesh(n), "auto")[1].exchange == expected
    small = strategy.init(jax.random.key(0), jnp.zeros(MIN_SLICE))  # one slice would be all of it
    assert execution.check_evolve_args(strategy, es.fitness.adapter(sphere), small, 1, es.make_mesh(8), "auto")[1].exchange == "fitness"
    low_rank = es.OpenES(popsize=16, noise=es.LowRankNoise())
    state = low_rank.init(jax.random.key(0), {"w": jnp.zeros((10, 30))})
    assert execution.check_evolve_args(low_rank, es.fitness.adapter(sphere), state, 1, es.make_mesh(8), "auto")[1].exchange == "fitness"
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


def test_evolve_many_with_the_update_split_is_evolve_many_with_fitness():
    strategy = COORDINATEWISE["SNES"]
    states = [strategy.init(jax.random.key(seed), odd_sized_params()) for seed in (0, 1)]
    sharded = es.evolve_many([strategy] * 2, noisy_fitness, states, 2, mesh=es.make_mesh(8), exchange="sharded")
    chex.assert_trees_all_equal(sharded, es.evolve_many([strategy] * 2, noisy_fitness, states, 2, mesh=es.make_mesh(1)))
