"""The recommended strategy for a task: the defaults that work without tuning, in one place."""

from __future__ import annotations

import optax

import es
from tasks.envs import EnvTask

ENV_STRATEGY = {"popsize": 128, "sigma": 0.1, "learning_rate": 0.03}
FUNCTION_STRATEGY = {"popsize": 64, "sigma_fraction": 0.05, "learning_rate_fraction": 0.01}


def default_strategy(task) -> es.OpenES:
    """An ``es.OpenES`` that works on ``task`` without tuning.

    Environments (``tasks.make(env_id)`` with its default MLP of 64 x 64 relu
    units and observation normalisation for vector observations): popsize 128,
    sigma 0.1, ``adam(0.03)``, antithetic sampling, centered ranks. It solves
    CartPole-v1, Acrobot-v1, MountainCar-v0 and MountainCarContinuous-v0 within
    50 generations and Pendulum-v1 within about 100-200 (docs/tasks.md).

    Benchmark functions: popsize 64, sigma 5% and an ``adam`` step of 1% of
    the search box's width, centered ranks, minimising ``-fitness`` by
    maximising ``fitness``.
    """
    if isinstance(task, EnvTask):
        return es.OpenES(
            popsize=ENV_STRATEGY["popsize"],
            sigma=ENV_STRATEGY["sigma"],
            optimizer=optax.adam(ENV_STRATEGY["learning_rate"]),
        )
    width = float(task.upper - task.lower)
    return es.OpenES(
        popsize=FUNCTION_STRATEGY["popsize"],
        sigma=FUNCTION_STRATEGY["sigma_fraction"] * width,
        optimizer=optax.adam(FUNCTION_STRATEGY["learning_rate_fraction"] * width),
    )
