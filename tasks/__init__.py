"""tasks: problems to optimise with ``es``.

    task = tasks.make(name, **options)   # benchmark functions, gymnax ids, "gymnasium:<id>"
    params = task.init_params(key)       # a pytree
    fitness = task.fitness(params, key)  # jittable, vmappable scalar; higher is better

``task.fitness`` can be passed directly to ``es.evolve`` as ``fitness_fn``;
``tasks.names()`` lists every name ``make`` accepts (``tasks.is_name(name)`` checks one, without importing
gymnax for a name registered in ``tasks``) and ``tasks.options(name)`` the options of one.
``tasks.default_strategy(task)`` is the recommended strategy for a task, and ``tasks.default_settings(task)`` the
same as a config's strategy section. See docs/tasks.md.
"""

from tasks.registry import is_name, make, names, options, register, register_family
from tasks import functions as _functions  # noqa: F401  (registers the benchmark functions)
from tasks import bbob as _bbob  # noqa: F401  (registers the BBOB-style functions)
from tasks import envs as _envs  # noqa: F401  (registers every gymnax environment, lazily)
from tasks import gym as _gym  # noqa: F401  (registers every gymnasium environment as "gymnasium:<id>", lazily)
from tasks.bbob import BBOBTask
from tasks.defaults import default_settings, default_strategy
from tasks.envs import EnvFitnessState, EnvTask, Rollouts
from tasks.functions import FunctionTask
from tasks.gym import GymTask
from tasks.obs_norm import ObsStats
from tasks.policies import BoxHead, CNNPolicy, DiscreteHead, GaussianHead, MLPPolicy

__all__ = [
    "BBOBTask",
    "BoxHead",
    "CNNPolicy",
    "DiscreteHead",
    "EnvFitnessState",
    "EnvTask",
    "FunctionTask",
    "GaussianHead",
    "GymTask",
    "MLPPolicy",
    "ObsStats",
    "Rollouts",
    "default_settings",
    "default_strategy",
    "is_name",
    "make",
    "names",
    "options",
    "register",
    "register_family",
]
