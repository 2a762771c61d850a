"""es.evolve_many and es.run_many: every run equals its own es.evolve, one compilation, memory bounded by the
micro-batches, clear errors for runs that cannot share a program, per-run directories that resume."""

import logging
import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import compiled_temp_bytes, noisy_policy_return, policy_params, sphere
from test_validation import raises

import es
import tasks

pytestmark = pytest.mark.slow  # make test-fast leaves it out: sweeps against separate runs, strategy by strategy

GENERATIONS = 3

# Runs that differ in every numeric hyperparameter a strategy has (and in seed); one case per strategy.
SWEEPS = {
    "OpenES": [es.OpenES(popsize=16, sigma=s, weight_decay=w, optimizer=optax.inject_hyperparams(optax.adam)(learning_rate=lr))
               for s, w, lr in ((0.1, 0.0, 0.01), (0.2, 0.01, 0.1))],  # the optimizer's learning rate too
    "SNES": [es.SNES(popsize=16, sigma=s, learning_rate=lr, sigma_learning_rate=slr)
             for s, lr, slr in ((0.3, 1.0, 0.1), (0.1, 0.5, 0.2))],
    "PGPE": [es.PGPE(popsize=16, sigma=s, sigma_learning_rate=slr, sigma_max_change=c)
             for s, slr, c in ((0.3, 0.1, 0.2), (0.1, 0.2, 0.1))],
    "ARS": [es.ARS(popsize=16, sigma=s, learning_rate=lr, top_k=4) for s, lr in ((0.1, 0.05), (0.2, 0.02))],
    "SepCMAES": [es.SepCMAES(popsize=16, sigma=s) for s in (0.3, 0.1)],
}


def initial_states(strategies, params=None):
    params = policy_params(jax.random.key(1)) if params is None else params
    return [strategy.init(jax.random.key(seed), params) for seed, strategy in enumerate(strategies)]


def host(tree):
    """Numpy copies of every leaf (PRNG keys as their key data), to compare across devices and programs."""
    def leaf(x):
        return np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)

    return jax.tree.map(leaf, tree)


def evolve_both(strategies, fitness_fn, params, mesh, compared=None):
    """``(evolve_many's states and metrics, each run's own es.evolve)``, on the host, for the runs ``compared``
    (default: every run; each run's es.evolve is a compilation of its own)."""
    states = initial_states(strategies, params)
    finals, metrics = es.evolve_many(strategies, fitness_fn, states, GENERATIONS, mesh=mesh)
    assert len(finals) == len(metrics) == len(strategies)
    assert not np.array_equal(metrics[0]["fitness_mean"], metrics[1]["fitness_mean"])  # the runs differ
    compared = range(len(strategies)) if compared is None else compared
    alone = [es.evolve(strategies[i], fitness_fn, states[i], GENERATIONS, mesh=mesh) for i in compared]
    return host([(finals[i], metrics[i]) for i in compared]), host(alone)


@pytest.mark.parametrize("name", ["SNES", "PGPE", "ARS", "SepCMAES"])  # OpenES: bit-identical on the rollout below
def test_other_strategies_on_a_sphere_are_bit_identical_to_their_own_evolve(name):
    swept, alone = evolve_both(SWEEPS[name], sphere, {"w": jnp.linspace(-1, 1, 50).reshape(5, 10), "b": jnp.ones(3)},
                               mesh=None)
    chex.assert_trees_all_equal(swept, alone)


def test_openes_on_a_policy_rollout_is_bit_identical_to_its_own_evolve_on_2_devices():
    # Every run: sigma, weight_decay and an inject_hyperparams learning rate vary.
    swept, alone = evolve_both(SWEEPS["OpenES"], noisy_policy_return, None, es.make_mesh(2))
    chex.assert_trees_all_equal(swept, alone)


@pytest.mark.parametrize("name", ["SNES", "PGPE", "ARS", "SepCMAES"])
def test_other_strategies_on_a_policy_rollout_equal_their_own_evolve_within_float32_rounding(name):
    # XLA contracts a * b + c into one FMA where a fusion holds both: the update of SNES, PGPE, ARS and
    # SepCMAES (mean + step) may then round differently in the sweep's program than in es.evolve's
    # (measured: the last bit of some params, from the first generation on).
    # The second run (the first is compared bit for bit on the sphere above, with the same strategies).
    swept, alone = evolve_both(SWEEPS[name], noisy_policy_return, None, es.make_mesh(2), compared=[1])
    chex.assert_trees_all_close(swept, alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["SNES", "SepCMAES"])
def test_a_sweep_of_one_run_is_bit_identical_to_its_own_evolve(name):
    # One run is es.evolve's own program. As a one-trip lax.map, which XLA inlines and fuses with what
    # surrounds it, SNES's update rounded differently from es.evolve's here (best_fitness -12.550223 against
    # -12.550221 after 3 generations), so a single-seed `reproduce --seeds 1` left `train --set run.seed=1`
    # after 25 generations of Breakout.
    strategy = SWEEPS[name][1]
    state = initial_states([strategy])[0]
    (final,), (metrics,) = es.evolve_many([strategy], noisy_policy_return, [state], GENERATIONS, mesh=es.make_mesh(2))
    alone = es.evolve(strategy, noisy_policy_return, state, GENERATIONS, mesh=es.make_mesh(2))
    chex.assert_trees_all_equal(host((final, metrics)), host(alone))


def test_env_runs_with_observation_normalisation_are_bit_identical_to_evolve():
    task = tasks.make("Pendulum-v1", num_episodes=1, max_steps=8, hidden_sizes=(4,), obs_norm=True)
    strategies = [es.OpenES(popsize=8, sigma=0.05)] * 2  # seeds only: the hyperparameters are tested above
    states = [es.init_from_seed(s, seed, task.init_params, fitness=task.fitness) for seed, s in enumerate(strategies)]
    finals, metrics = es.evolve_many(strategies, task.fitness, states, 2)
    for strategy, state, final, run_metrics in zip(strategies, states, finals, metrics):
        alone, alone_metrics = es.evolve(strategy, task.fitness, state, 2)
        chex.assert_trees_all_equal(host(final), host(alone))  # fitness_state (running obs stats) included
        chex.assert_trees_all_equal(host(run_metrics), host(alone_metrics))


class CompileLog(logging.Handler):
    """Counts XLA compilations of the sweep's program."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def emit(self, record):
        self.count += record.getMessage().startswith("Finished XLA compilation of jit(_evolve_many_compiled)")


def compilations(fn):
    handler = CompileLog()
    logger = logging.getLogger("jax")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        with jax.log_compiles(True):
            jax.block_until_ready(fn())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return handler.count


def test_one_compilation_serves_every_run_and_other_values_of_the_same_fields():
    def sweep(sigmas, learning_rates, seeds):
        strategies = [es.OpenES(popsize=8, sigma=s, optimizer=optax.inject_hyperparams(optax.sgd)(learning_rate=lr))
                      for s, lr in zip(sigmas, learning_rates)]
        states = [s.init(jax.random.key(seed), jnp.ones(5)) for s, seed in zip(strategies, seeds)]
        return lambda: es.evolve_many(strategies, sphere, states, 2)

    assert compilations(sweep((0.1, 0.2, 0.3, 0.4), (0.1, 0.1, 0.2, 0.2), (0, 1, 2, 3))) == 1
    assert compilations(sweep((0.5, 0.6, 0.7, 0.8), (0.3, 0.3, 0.4, 0.4), (4, 5, 6, 7))) == 0


def test_memory_grows_with_runs_times_micro_batch_never_with_popsize():
    dim = 20_000

    def temp_bytes(popsize, runs):
        strategies = [es.OpenES(popsize=popsize, sigma=0.1 * (i + 1)) for i in range(runs)]
        states = initial_states(strategies, jnp.ones(dim))
        return compiled_temp_bytes(jax.jit(lambda s: es.evolve_many(strategies, sphere, s, 1, eval_batch_size=4,
                                                                   update_batch_size=16)).lower(states))

    small, large = temp_bytes(64, 2), temp_bytes(512, 2)
    assert large - small < 4 * dim, (small, large)  # 8x the popsize: not one more params-sized buffer
    assert temp_bytes(64, 4) - small >= 2 * 4 * 4 * dim  # 2 more runs: 2 x eval_batch_size more perturbations


# ------------------------------------------------------------------------------------------------ errors

ADAM = optax.adam(0.05)
BASE = es.OpenES(popsize=8, sigma=0.1, optimizer=ADAM)


def refused(strategies, states=None, params=None, fitness=sphere):
    states = initial_states(strategies, jnp.ones(4) if params is None else params) if states is None else states
    return es.evolve_many(strategies, fitness, states, 1)


@pytest.mark.parametrize("other, error, fragments", [
    (es.SNES(popsize=8), TypeError, ["strategies[1] is SNES but strategies[0] is OpenES", "one kind"]),
    (es.OpenES(popsize=16, optimizer=ADAM), ValueError, ["strategies[1].popsize=16 but strategies[0].popsize=8",
                                                         "sigma, weight_decay"]),
    (es.OpenES(popsize=8, antithetic=False, optimizer=ADAM), ValueError, ["antithetic=False", "antithetic=True"]),
    (es.OpenES(popsize=8, noise=es.NoiseTable(size=4096), optimizer=ADAM), ValueError, ["strategies[1].noise"]),
    (es.OpenES(popsize=8, fitness_shaping="z_score", optimizer=ADAM), ValueError, ["fitness_shaping='z_score'"]),
    (es.OpenES(popsize=8, sigma=optax.constant_schedule(0.1), optimizer=ADAM), ValueError,
     ["strategies[1].sigma", "compared by identity"]),
    (es.OpenES(popsize=8, optimizer=optax.adam(0.1)), ValueError,
     ["strategies[1].optimizer computes differently", "optax.inject_hyperparams(optax.adam)"]),
    (es.OpenES(popsize=8, optimizer=optax.sgd(0.05)), ValueError, ["strategies[1].optimizer computes differently"]),
])
def test_runs_that_cannot_share_a_program_are_refused_naming_the_field(other, error, fragments):
    with raises(error, *fragments):
        refused([BASE, other])


def test_inject_hyperparams_optimizers_must_wrap_the_same_optimizer():
    adam, sgd = (optax.inject_hyperparams(f)(learning_rate=0.1) for f in (optax.adam, optax.sgd))
    with raises(ValueError, "strategies[1].optimizer computes differently", "beyond the hyperparameters"):
        refused([es.OpenES(popsize=8, optimizer=adam), es.OpenES(popsize=8, optimizer=sgd)])
    nesterov = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1, momentum=0.9, nesterov=True)
    plain = optax.inject_hyperparams(optax.sgd)(learning_rate=0.2, momentum=0.9, nesterov=False)
    with raises(ValueError, "static argument"):
        refused([es.OpenES(popsize=8, optimizer=nesterov), es.OpenES(popsize=8, optimizer=plain)])


def test_optimizers_built_apart_with_the_same_settings_share_the_program():
    strategies = [es.OpenES(popsize=8, optimizer=optax.adam(0.05)), es.OpenES(popsize=8, optimizer=optax.adam(0.05))]
    states = initial_states(strategies, jnp.ones(4))
    es.engine.sweep.check_same_program(strategies, states[0].params)  # accepted: one program
    chex.assert_trees_all_equal(host(es.evolve_many(strategies, sphere, states, 1)[0][1]),
                                host(es.evolve(strategies[1], sphere, states[1], 1)[0]))


def test_states_of_other_shapes_or_counts_are_refused():
    strategies = [BASE, BASE]
    with raises(ValueError, "states[1].params['w'] is float32[5], expected float32[4] (as in states[0])"):
        refused(strategies, [BASE.init(jax.random.key(0), {"w": jnp.ones(4)}),
                             BASE.init(jax.random.key(1), {"w": jnp.ones(5)})])
    with raises(ValueError, "2 strategies but 1 states"):
        refused(strategies, initial_states([BASE]))
    with raises(TypeError, "strategies must be a non-empty list"):
        refused([], [])
    with raises(TypeError, "strategies[1] must be an es strategy"):
        refused([BASE, "OpenES"], initial_states([BASE, BASE]))
    snes = es.SNES(popsize=8)
    with raises(ValueError, "states[1] (of strategies[1])", "strategy_state does not match"):
        refused([snes, snes], [snes.init(jax.random.key(0), jnp.ones(4)), BASE.init(jax.random.key(1), jnp.ones(4))])


def test_one_state_or_strategy_instead_of_a_list_is_refused_naming_the_argument():
    state = BASE.init(jax.random.key(0), jnp.ones(4))  # a State is a NamedTuple of 8 fields: not counted as 8 runs
    with raises(TypeError, "es.evolve_many(states=...): got one es.State", "states=[state]"):
        refused([BASE], state)
    with raises(TypeError, "es.evolve_many(strategies=...): got one strategy", "strategies=[strategy]"):
        refused(BASE, [state])


def test_a_host_fitness_is_refused_before_any_worker_starts():
    host = es.HostFitness(lambda params, seed: 0.0, num_workers=1)
    with raises(TypeError, "es.HostFitness is not supported in a sweep", "es.evolve or es.run"):
        es.evolve_many([BASE, BASE], host, initial_states([BASE, BASE]), 1)
    host.close()


# ------------------------------------------------------------------------------------------------ run_many

RUNS = [es.OpenES(popsize=8, sigma=s, optimizer=ADAM) for s in (0.1, 0.2)]
PARAMS = {"w": jnp.linspace(-1.0, 1.0, 6), "b": jnp.ones(2)}


def run_many(run_dirs, generations, **kwargs):
    states = initial_states(RUNS, PARAMS)
    configs = [{"sigma": s.sigma, "seed": i} for i, s in enumerate(RUNS)]
    return es.run_many(RUNS, sphere, states, generations, run_dirs=run_dirs, segment=2, configs=configs,
                       progress=False, **kwargs)


def test_run_many_writes_each_run_as_es_run_would_and_resumes_bit_for_bit(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    straight, straight_metrics = es.evolve_many(RUNS, sphere, initial_states(RUNS, PARAMS), 6)
    first = run_many(dirs, 4)
    assert all(result.completed for result in first)
    assert [sorted(int(p.name) for p in (d / "checkpoints").iterdir()) for d in dirs] == [[2, 4]] * 2
    resumed = run_many(dirs, 6, resume=True)
    for result, final, metrics, run_dir in zip(resumed, straight, straight_metrics, dirs):
        chex.assert_trees_all_equal(host(result.state), host(final))
        chex.assert_trees_all_equal(result.metrics, host(metrics))
        assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 6
        assert (run_dir / "params.npz").is_file()
    # Each directory is an es.run directory: the second run continues alone, to the same state as the sweep's.
    longer = es.run(RUNS[1], sphere, initial_states(RUNS, PARAMS)[1], 8, run_dir=dirs[1], segment=2,
                    config={"sigma": 0.2, "seed": 1}, resume=True, progress=False)
    chex.assert_trees_all_equal(host(longer.state), host(es.evolve(RUNS[1], sphere, straight[1], 2)[0]))


def test_run_many_resumes_every_run_at_the_latest_generation_all_of_them_reached(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    run_many(dirs, 4)
    shutil.rmtree(dirs[1] / "checkpoints" / "4")  # killed after run a's checkpoint of generation 4, before b's
    resumed = run_many(dirs, 6, resume=True)
    straight, _ = es.evolve_many(RUNS, sphere, initial_states(RUNS, PARAMS), 6)
    for result, final in zip(resumed, straight):
        chex.assert_trees_all_equal(host(result.state), host(final))
    assert sorted(int(p.name) for p in (dirs[0] / "checkpoints").iterdir())[-1] == 6


def test_run_many_refuses_shared_directories_and_a_single_checkpoint(tmp_path):
    with raises(ValueError, "every run needs its own directory"):
        run_many([tmp_path, tmp_path], 2)
    with raises(ValueError, "keep_checkpoints=1", "at least 2"):
        run_many([tmp_path / "a", tmp_path / "b"], 2, keep_checkpoints=1)
    with raises(ValueError, "one entry per run (2)"):
        run_many([tmp_path / "a"], 2)


def test_run_many_calls_on_segment_with_every_runs_segment():
    seen = []
    results = run_many(None, 4, on_segment=lambda segments: seen.append([(s.start, s.stop) for s in segments]))
    assert seen == [[(0, 2), (0, 2)], [(2, 4), (2, 4)]]
    assert [r.metrics["fitness_mean"].shape for r in results] == [(4,), (4,)]


def test_a_switch_is_program_structure_that_the_runs_agree_on_and_no_traced_value_decides():
    adapted, fixed = es.PGPE(popsize=8, sigma_learning_rate=0.1), es.PGPE(popsize=8, sigma_learning_rate=0.0)
    with raises(ValueError, "strategies[1].sigma_learning_rate=0.0 but strategies[0].sigma_learning_rate=0.1",
                "switches part of its update off"):
        refused([adapted, fixed])
    # What the float decides is static configuration, kept by the program; the program's float itself is traced.
    assert adapted.program().adapts_sigma and not fixed.program().adapts_sigma
    with pytest.raises(TypeError, match=r"read it from the hyperparameters \(hp.<name>"):
        adapted.program().sigma_learning_rate * 2.0
    # Runs that all keep sigma fixed (as low-rank noise needs) vary the other numbers; sigma stays each run's own.
    runs = [es.PGPE(popsize=8, sigma=s, sigma_learning_rate=0.0, noise=es.LowRankNoise(rank=1)) for s in (0.1, 0.3)]
    finals, metrics = es.evolve_many(runs, sphere, initial_states(runs, {"w": jnp.ones((3, 4))}), 2)
    for run, final, run_metrics in zip(runs, finals, metrics):
        np.testing.assert_array_equal(final.strategy_state.sigma, np.full(12, run.sigma, np.float32))
        np.testing.assert_allclose(run_metrics["sigma"], run.sigma, rtol=1e-6)
