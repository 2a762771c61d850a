"""tasks: problems to optimise with ``es``.

    task = tasks.make(name, **options)   # benchmark functions (and, later, gymnax environments)
    params = task.init_params(key)       # a pytree
    fitness = task.fitness(params, key)  # jittable, vmappable scalar; higher is better

``task.fitness`` can be passed directly to ``es.evolve`` as ``fitness_fn``;
``tasks.names()`` lists every name ``make`` accepts.
"""

from tasks.registry import make, names, register
from tasks import functions as _functions  # noqa: F401  (registers the benchmark functions)

__all__ = ["make", "names", "register"]
