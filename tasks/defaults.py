"""The recommended strategy for a task, and each strategy's default for it: the numbers, in one place."""

from __future__ import annotations

import es
from es import validation
from es.strategies import optimizers
from tasks.envs import EnvTask
from tasks.gym import GymTask

RECOMMENDED = "OpenES"
"""What ``default_strategy(task)`` returns when no strategy is named, unless ``recommended(task)`` says otherwise."""
RECOMMENDED_GYMNASIUM = "ARS"
"""... on gymnasium tasks (``tasks.make("gymnasium:<id>")``): Mania et al. 2018's linear policies."""
RECOMMENDED_IMAGES = "SNES"
"""... on gymnax tasks with image observations (MinAtar): its per-parameter scales keep exploring where
OpenAI-ES stalled on these nearly deterministic games (docs/tasks.md, MinAtar)."""

ENV_DEFAULTS: dict[str, dict] = {
    "OpenES": {"popsize": 256, "sigma": 0.1, "optimizer": {"name": "adam", "learning_rate": 0.03}},
    "SNES": {"popsize": 256, "sigma": 0.1},
    "PGPE": {"popsize": 128, "sigma": 0.1},
    "ARS": {"popsize": 256, "sigma": 0.05, "learning_rate": 0.05, "top_k": 32},
    "SepCMAES": {"popsize": 256, "sigma": 0.1},
    "CMAES": {"popsize": 64, "sigma": 0.1},
}
"""Constructor arguments of each strategy for environments (``tasks.make(env_id)``, its default policy);
an ``optimizer`` is given as ``{"name": ..., **arguments}`` (``es.optimizers.make``)."""

FUNCTION_DEFAULTS: dict[str, dict] = {
    "OpenES": {"popsize": 64, "sigma_fraction": 0.05, "optimizer": {"name": "adam", "learning_rate_fraction": 0.01}},
    "SNES": {"popsize": 64, "sigma_fraction": 0.1},
    "PGPE": {"popsize": 64, "sigma_fraction": 0.1,
             "optimizer": {"name": "clipup", "learning_rate_fraction": 0.01, "max_speed_fraction": 0.02}},
    "ARS": {"popsize": 64, "sigma_fraction": 0.05, "learning_rate_fraction": 0.01},
    "SepCMAES": {"popsize": 64, "sigma_fraction": 0.3},
    "CMAES": {"popsize": 64, "sigma_fraction": 0.3},
}
"""The same for benchmark functions; ``<argument>_fraction`` is that argument as a fraction of the search
box's width ``upper - lower``."""

GYM_STRATEGY = {
    "Hopper": {"popsize": 16, "top_k": 4, "learning_rate": 0.01, "sigma": 0.025},
    "HalfCheetah": {"popsize": 64, "top_k": 4, "learning_rate": 0.02, "sigma": 0.03},
    "Walker2d": {"popsize": 80, "top_k": 30, "learning_rate": 0.03, "sigma": 0.025},
    "Ant": {"popsize": 120, "top_k": 20, "learning_rate": 0.015, "sigma": 0.025},
    "Humanoid": {"popsize": 460, "top_k": 230, "learning_rate": 0.02, "sigma": 0.0075},
}
"""``es.ARS`` (V2-t) on the gymnasium MuJoCo locomotion envs, by family (the env id before ``-v``): Mania et al.
2018 (arXiv:1803.07055), table 9, the hyperparameters of their V2-t results on the v1 envs (``popsize`` = 2 x
their directions N, ``top_k`` = b, ``learning_rate`` = alpha, ``sigma`` = nu; the same values are in their
code's README, github.com/modestyachts/ARS, and in rl-baselines3-zoo's hyperparams/ars.yml for the v3 envs).
Results on the v5 envs: docs/results.md (Humanoid: not run here, 460 episodes a generation)."""
GYM_STRATEGY_FALLBACK = {"popsize": 16, "top_k": 4, "learning_rate": 0.02, "sigma": 0.03}
"""``es.ARS`` on every other gymnasium env: not tuned (8 directions, the best 4, step 0.02, noise 0.03)."""

FRACTION = "_fraction"


def _arguments(spec: dict, width: float) -> dict:
    """A spec's arguments as numbers: ``x_fraction`` becomes ``x = x_fraction * width``, in an optimizer's
    ``{"name": ..., **arguments}`` too."""
    arguments = {}
    for key, value in spec.items():
        if isinstance(value, dict):
            rest = {k: v for k, v in value.items() if k != "name"}
            arguments[key] = {"name": value["name"], **_arguments(rest, width)}
        elif key.endswith(FRACTION):
            arguments[key.removesuffix(FRACTION)] = value * width
        else:
            arguments[key] = value
    return arguments


def recommended(task) -> str:
    """The name of the strategy ``default_strategy(task)`` returns: ``RECOMMENDED`` unless the task is a
    gymnasium task (``RECOMMENDED_GYMNASIUM``) or a gymnax task with image observations (``RECOMMENDED_IMAGES``)."""
    if isinstance(task, GymTask):
        return RECOMMENDED_GYMNASIUM
    if isinstance(task, EnvTask) and task.image_observations:
        return RECOMMENDED_IMAGES
    return RECOMMENDED


def default_strategy(task, name: str | None = None) -> es.Strategy:
    """A strategy that works on ``task`` without tuning: the recommended one, or strategy ``name``'s default.

    Args:
      task: from ``tasks.make`` (an environment or a benchmark function).
      name: ``"OpenES"``, ``"SNES"``, ``"PGPE"``, ``"ARS"``, ``"SepCMAES"`` or ``"CMAES"``
        (the keys of ``es.STRATEGIES``), or ``None`` for the recommended one
        (``recommended(task)``): ``"OpenES"``, but ``"ARS"`` on a gymnasium
        task and ``"SNES"`` on a gymnax task with image observations
        (MinAtar). Every argument not listed below keeps the strategy's own
        default.

    Environments (``tasks.make(env_id)`` with its default MLP of 64 x 64 relu
    units and observation normalisation for vector observations),
    ``ENV_DEFAULTS``:

    - OpenES: popsize 256, sigma 0.1, ``adam(0.03)``, antithetic, centered ranks;
    - SNES: popsize 256, sigma 0.1 (``learning_rate`` 1, ``sigma_learning_rate``
      ``(3 + ln d) / (5 sqrt d)``);
    - PGPE: popsize 128, sigma 0.1 (its own ``es.clipup(0.15, max_speed=0.3)``);
    - ARS: popsize 256 (128 directions, the best 32 kept), sigma 0.05,
      learning rate 0.05;
    - SepCMAES: popsize 256, sigma 0.1;
    - CMAES: popsize 64, sigma 0.1 (policies of at most 4,096 params: the
      default 64 x 64 MLP has more, which CMAES refuses).

    Each reaches a return of 500 on CartPole-v1 and better than -200 on
    Pendulum-v1 on seeds 0, 1 and 2 (``python -m experiments.check_defaults``;
    generations and wall times in docs/tasks.md).

    Environments with image observations (MinAtar; ``tasks.make(env_id)``
    gives them a linear policy, sampled actions and observation
    normalisation) get SNES's default when no name is given: it beats a
    random policy on every MinAtar game within 150 generations
    (``python -m experiments.check_defaults --envs <game>-MinAtar``, docs/tasks.md).

    Benchmark functions (``FUNCTION_DEFAULTS``; ``w = upper - lower``, the
    search box's width), maximising ``fitness = -f``:

    - OpenES: popsize 64, sigma ``0.05 w``, ``adam(0.01 w)``;
    - SNES: popsize 64, sigma ``0.1 w``;
    - PGPE: popsize 64, sigma ``0.1 w``, ``es.clipup(0.01 w, max_speed=0.02 w)``;
    - ARS: popsize 64, sigma ``0.05 w``, learning rate ``0.01 w``;
    - SepCMAES: popsize 64, sigma ``0.3 w``;
    - CMAES: popsize 64, sigma ``0.3 w``.

    gymnasium environments (``tasks.make("gymnasium:<id>")``, a linear policy
    with observation normalisation): ``es.ARS``, Mania et al. 2018's V2-t,
    with the hyperparameters of their table 9 for the MuJoCo locomotion
    families (``GYM_STRATEGY``; any version, e.g. ``Walker2d-v5``):

    - Hopper: 8 directions, top 4, step 0.01, noise 0.025;
    - HalfCheetah: 32 directions, top 4, step 0.02, noise 0.03;
    - Walker2d: 40 directions, top 30, step 0.03, noise 0.025;
    - Ant: 60 directions, top 20, step 0.015, noise 0.025 (``tasks.make``
      trains Ant on 250-step episodes with common random numbers,
      ``tasks.gym.TRAINING_DEFAULTS``);
    - Humanoid: 230 directions, all kept, step 0.02, noise 0.0075 (not run
      here).

    Every other gymnasium environment gets ``GYM_STRATEGY_FALLBACK``, not
    tuned: 8 directions, top 4, step 0.02, noise 0.03. Results:
    docs/results.md.

    Raises:
      ValueError: ``name`` is not a strategy's name.
    """
    settings = default_settings(task, name)
    arguments = {key: optimizers.make(**value) if isinstance(value, dict) else value
                 for key, value in settings.items() if key != "name"}
    return es.STRATEGIES[settings["name"]](**arguments)


def default_settings(task, name: str | None = None) -> dict:
    """``default_strategy(task, name)`` as a config's strategy section: ``{"name": ..., "popsize": ..., ...}``,
    its optimizer as ``{"name": ..., **arguments}`` (``es.optimizers.make``), every value a number or a name.
    What ``python -m experiments.train`` starts from when a config gives no ``strategy.popsize``."""
    if name is None:
        name = recommended(task)
    validation.check_choice("tasks.default_strategy", "name", name, list(ENV_DEFAULTS))
    if isinstance(task, GymTask) and name == "ARS":
        spec, width = GYM_STRATEGY.get(task.env_id.split("-v")[0], GYM_STRATEGY_FALLBACK), 1.0
    elif isinstance(task, (EnvTask, GymTask)):  # other strategies on gymnasium: the environment defaults
        spec, width = ENV_DEFAULTS[name], 1.0
    else:
        spec, width = FUNCTION_DEFAULTS[name], float(task.upper - task.lower)
    return {"name": name, **_arguments(spec, width)}
