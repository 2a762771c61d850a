"""Record OpenES reference runs (params, optimizer state, metrics) to ``openes_reference.npz``.

Run once on the commit before the strategies refactor (main at 371dba1, 2026-11-23) with
``python tests/data/make_openes_reference.py``; ``tests/test_openes_reference.py`` checks that the current
engine reproduces every array bit for bit. Kept to document where the file came from; it uses only
the API that existed then (``es.OpenES(..., exchange=..., eval_batch_size=..., update_batch_size=...)``).
"""

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import es  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def rastrigin(x, key):
    del key
    return -(10.0 * x.size + jnp.sum(x**2 - 10.0 * jnp.cos(2 * jnp.pi * x)))


def sphere(params, key):
    del key
    return -sum(jnp.sum(x**2) for x in jax.tree.leaves(params))


def noisy_policy_return(params, key, horizon=20, noise_scale=0.1):
    w1, w2 = params["w1"], params["w2"]

    def step(carry, step_key):
        obs, total = carry
        action = jnp.tanh(jnp.tanh(obs @ w1) @ w2)
        obs = 0.9 * obs + 0.1 * action + noise_scale * jax.random.normal(step_key, obs.shape)
        return (obs, total - jnp.sum(obs**2)), None

    (_, total), _ = jax.lax.scan(step, (jnp.ones(4), 0.0), jax.random.split(key, horizon))
    return total


def policy_params(key):
    k1, k2 = jax.random.split(key)
    return {"w1": 0.1 * jax.random.normal(k1, (4, 32)), "w2": 0.1 * jax.random.normal(k2, (32, 4))}


# name -> (strategy kwargs without exchange/batch sizes, execution kwargs, fitness, params, generations, devices)
CASES = {
    "rastrigin_antithetic_prng": (
        dict(popsize=64, sigma=0.1, optimizer=optax.adam(0.05)), {},
        rastrigin, jnp.linspace(-3.0, 3.0, 200), 8, 1),
    "policy_plain_zscore_small_batches": (
        dict(popsize=48, sigma=0.1, antithetic=False, fitness_shaping="z_score"),
        dict(eval_batch_size=2, update_batch_size=5),
        noisy_policy_return, policy_params(jax.random.key(2)), 4, 4),
    "sphere_table_schedule_decay": (
        dict(popsize=32, sigma=optax.exponential_decay(0.2, 3, 0.5), optimizer=optax.sgd(0.1, momentum=0.9),
             weight_decay=0.01, noise=es.NoiseTable(size=2**16, seed=3)), {},
        sphere, {"a": jnp.ones((10, 5)), "b": jnp.full((7,), -2.0)}, 6, 2),
    "sphere_minimize_raw": (
        dict(popsize=16, sigma=0.05, maximize=False, fitness_shaping="raw", optimizer=optax.adam(0.02)), {},
        lambda x, key: jnp.sum((x - 1.0) ** 2), jnp.zeros(30), 5, 8),
}


def main():
    arrays = {}
    for name, (kwargs, execution, fitness_fn, params, generations, devices) in CASES.items():
        strategy = es.OpenES(**kwargs, **execution)
        state = strategy.init(jax.random.key(7), params)
        state, metrics = es.evolve(strategy, fitness_fn, state, generations, mesh=es.make_mesh(devices))
        for path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]:
            arrays[f"{name}/params{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(state.best_params)[0]:
            arrays[f"{name}/best_params{jax.tree_util.keystr(path)}"] = np.asarray(leaf)
        arrays[f"{name}/best_fitness"] = np.asarray(state.best_fitness)
        for key, values in metrics.items():
            arrays[f"{name}/metrics/{key}"] = np.asarray(values)
    np.savez(os.path.join(HERE, "openes_reference.npz"), **arrays)
    print(f"wrote {len(arrays)} arrays")


if __name__ == "__main__":
    main()
