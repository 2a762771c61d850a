"""Record reference runs of every strategy (params, best member, scales, metrics) to ``strategy_references.npz``.

Recorded on main at d064cb4 (2026-11-26, before the one-contract refactor), on the machine that checks them,
with ``python tests/data/make_strategy_references.py``. ``tests/test_strategy_references.py`` reruns each case
and checks the params, the best member and the per-coordinate scales bit for bit.

Re-recorded once, with the one-contract refactor (2026-11-26), after checking that only these cases changed,
and only in their last bits:

- ``snes_small``, ``snes_temperature_tree``, ``snes_sweep_0``/``_1``: the one update path compiles every
  strategy's update apart from the surrounding program (``es.engine.partition.apart``), which before was done
  only where the update could be split (more than 2**13 params); XLA's multiply-add contraction no longer
  follows the surrounding program.
- ``openes_clipup_tree``, ``pgpe_adam_tree``: the strategies' maths work on the flat vector of the params, so
  the optimizer steps one vector instead of each leaf (ClipUp's norm is one sum; Adam's step one fusion).

Every other case (the split updates on 20,000 params, SepCMAES, ARS, PGPE with ClipUp on one leaf, the
ask/tell loop) kept its bits. The cases cover every
strategy on small params (the replicated update) and on 20,000 params, where ``exchange="sharded"`` splits
a coordinatewise update over 8 devices, plus an ask/tell loop and a two-run sweep.

Only the public API that exists before and after the refactor is used here.
"""

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import es  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def rastrigin(x, key):
    del key
    return -(10.0 * x.size + jnp.sum(x**2 - 10.0 * jnp.cos(2 * jnp.pi * x)))


def noisy_sphere(params, key):
    x = jax.flatten_util.ravel_pytree(params)[0]
    return -jnp.sum((x - 0.5) ** 2) + 0.01 * jax.random.normal(key)


SMALL = jnp.linspace(-2.0, 2.0, 200)
TREE = {"a": jnp.linspace(-1.0, 1.0, 60).reshape(12, 5), "b": jnp.full((7,), 0.5)}
LARGE = jnp.linspace(-2.0, 2.0, 20_000)


def strategies():
    """name -> (strategy, fitness, params, generations, evolve keyword arguments)."""
    return {
        "snes_small": (es.SNES(popsize=16, sigma=0.3), rastrigin, SMALL, 6, dict(devices=4)),
        "snes_temperature_tree": (es.SNES(popsize=12, sigma=0.2, temperature=20.0, antithetic=True), noisy_sphere,
                                  TREE, 5, dict(devices=2)),
        "snes_large_sharded": (es.SNES(popsize=16, sigma=0.1), rastrigin, LARGE, 3,
                               dict(devices=8, exchange="sharded")),
        "snes_large_one_device": (es.SNES(popsize=16, sigma=0.1), rastrigin, LARGE, 3, dict(devices=1)),
        "sepcma_small": (es.SepCMAES(popsize=16, sigma=0.5), rastrigin, SMALL, 6, dict(devices=8)),
        "sepcma_large_sharded": (es.SepCMAES(popsize=8, sigma=0.2, maximize=True), rastrigin, LARGE, 3,
                                 dict(devices=8, exchange="sharded")),
        "pgpe_small": (es.PGPE(popsize=16, sigma=0.2), rastrigin, SMALL, 6, dict(devices=2)),
        "pgpe_adam_tree": (es.PGPE(popsize=16, sigma=0.2, optimizer=es.optimizers.make("adam", learning_rate=0.05)),
                           noisy_sphere, TREE, 5, dict(devices=4)),
        "pgpe_adam_large_sharded": (es.PGPE(popsize=16, sigma=0.1,
                                            optimizer=es.optimizers.make("adam", learning_rate=0.05)),
                                    rastrigin, LARGE, 3, dict(devices=8, exchange="sharded")),
        "pgpe_fixed_sigma_table": (es.PGPE(popsize=16, sigma=0.1, sigma_learning_rate=0.0,
                                           noise=es.NoiseTable(size=2**16, seed=1)),
                                   rastrigin, SMALL, 5, dict(devices=4)),
        "ars_small_top": (es.ARS(popsize=16, sigma=0.05, top_k=4, learning_rate=0.05), rastrigin, SMALL, 6,
                          dict(devices=8)),
        "ars_large_sharded_table": (es.ARS(popsize=16, sigma=0.05, learning_rate=0.02,
                                           noise=es.NoiseTable(size=2**18, seed=2)),
                                    rastrigin, LARGE, 3, dict(devices=8, exchange="sharded")),
        "openes_default_large_sharded": (es.OpenES(popsize=16, sigma=0.05), rastrigin, LARGE, 3,
                                         dict(devices=8, exchange="sharded")),
        "openes_clipup_tree": (es.OpenES(popsize=16, sigma=0.1, optimizer=es.clipup(0.1, 0.2), maximize=True),
                               noisy_sphere, TREE, 5, dict(devices=1)),
    }


def record(arrays, name, state, metrics):
    for prefix, tree in (("params", state.params), ("best_params", state.best_params)):
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            arrays[f"{name}/{prefix}{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
    arrays[f"{name}/best_fitness"] = np.asarray(state.best_fitness)
    for field in ("sigma", "cov", "path_sigma", "path_cov"):
        if hasattr(state.strategy_state, field):
            arrays[f"{name}/strategy_state/{field}"] = np.asarray(getattr(state.strategy_state, field))
    for key, values in metrics.items():
        arrays[f"{name}/metrics/{key}"] = np.asarray(values)


def ask_tell_case():
    """SepCMAES driven by ask/tell on a numpy objective, 6 generations."""
    strategy = es.SepCMAES(popsize=10, sigma=0.5, maximize=False)
    state = strategy.init(jax.random.key(3), jnp.full(10, 1.5))
    for _ in range(6):
        population = np.asarray(es.ask(strategy, state), np.float64)
        fitness = np.sum(population**2, axis=1) + 79.48
        state, metrics = es.tell(strategy, state, fitness)
    return state, jax.tree.map(lambda m: np.asarray(m)[None], metrics)


def sweep_case():
    """Two SNES runs that differ in sigma and seed, as one es.evolve_many."""
    runs = [es.SNES(popsize=16, sigma=s) for s in (0.1, 0.3)]
    states = [st.init(jax.random.key(seed), SMALL) for st, seed in zip(runs, (4, 5))]
    return es.evolve_many(runs, rastrigin, states, 4, mesh=es.make_mesh(2))


def main():
    arrays = {}
    for name, (strategy, fitness, params, generations, options) in strategies().items():
        options = dict(options)
        mesh = es.make_mesh(options.pop("devices"))
        state = strategy.init(jax.random.key(7), params)
        state, metrics = es.evolve(strategy, fitness, state, generations, mesh=mesh, **options)
        record(arrays, name, state, metrics)
    record(arrays, "sepcma_ask_tell", *ask_tell_case())
    states, metrics = sweep_case()
    for i, (state, run_metrics) in enumerate(zip(states, metrics)):
        record(arrays, f"snes_sweep_{i}", state, run_metrics)
    np.savez(os.path.join(HERE, "strategy_references.npz"), **arrays)
    print(f"wrote {len(arrays)} arrays")


if __name__ == "__main__":
    sys.exit(main())
