"""The recommended strategy for a task: the defaults that work without tuning, in one place."""

from __future__ import annotations

import optax

import es
from tasks.envs import EnvTask
from tasks.gym import GymTask

ENV_STRATEGY = {"popsize": 128, "sigma": 0.1, "learning_rate": 0.03}
FUNCTION_STRATEGY = {"popsize": 64, "sigma_fraction": 0.05, "learning_rate_fraction": 0.01}
# ARS (V2-t) on gymnasium tasks: Mania et al. 2018's hyperparameters (table 9) where they list the env,
# popsize = 2 x directions. Other envs get GYM_STRATEGY_FALLBACK (not tuned).
GYM_STRATEGY = {
    "Hopper": {"popsize": 16, "top_k": 4, "learning_rate": 0.01, "sigma": 0.025},
    "HalfCheetah": {"popsize": 64, "top_k": 4, "learning_rate": 0.02, "sigma": 0.03},
}
GYM_STRATEGY_FALLBACK = {"popsize": 16, "top_k": 4, "learning_rate": 0.02, "sigma": 0.03}


def default_strategy(task) -> es.Strategy:
    """A strategy that works on ``task`` without tuning (``es.OpenES``, or ``es.ARS`` for gymnasium tasks).

    Environments (``tasks.make(env_id)`` with its default MLP of 64 x 64 relu
    units and observation normalisation for vector observations): popsize 128,
    sigma 0.1, ``adam(0.03)``, antithetic sampling, centered ranks. It solves
    CartPole-v1, Acrobot-v1, MountainCar-v0 and MountainCarContinuous-v0 within
    50 generations and Pendulum-v1 within about 100-200 (docs/tasks.md).

    Benchmark functions: popsize 64, sigma 5% and an ``adam`` step of 1% of
    the search box's width, centered ranks, minimising ``-fitness`` by
    maximising ``fitness``.

    gymnasium environments (``tasks.make("gymnasium:<id>")``, a linear policy
    with observation normalisation): ``es.ARS``, Mania et al. 2018's V2-t,
    with their hyperparameters for Hopper (8 directions, top 4, step 0.01,
    noise 0.025) and HalfCheetah (32 directions, top 4, step 0.02, noise
    0.03); other environments get 8 directions, top 4, step 0.02, noise 0.03.
    Results: docs/results.md.
    """
    if isinstance(task, GymTask):
        return es.ARS(**GYM_STRATEGY.get(task.env_id.split("-v")[0], GYM_STRATEGY_FALLBACK))
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
