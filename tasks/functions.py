"""Benchmark functions as tasks: minimise ``f`` over a box; the fitness is ``-f(x)``.

Registered names (lower-case, words joined by ``_``), each with a ``dim=`` option
(default 10)::

    name              f(x*)              x*_i        search box (init_params draws from it)
    sphere            0                  0           [-5, 5]
    ellipsoid         0                  0           [-5, 5]
    rosenbrock        0                  1           [-5, 10]
    rastrigin         0                  0           [-5.12, 5.12]
    ackley            0                  0           [-32.768, 32.768]
    griewank          0                  0           [-600, 600]
    schwefel          ~0 (1.3e-5 * D)    420.968746  [-500, 500]
    styblinski_tang   -39.16616570 * D   -2.9035340  [-5, 5]

Every task knows its optimum (``task.optimum()`` and ``task.optimal_value()``),
so tests and users can measure the gap. The shifted and rotated BBOB-style
variants live in ``tasks/bbob.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from es import validation
from tasks.registry import make_owner, register


def sphere(x: jax.Array) -> jax.Array:
    """``sum x_i^2``; minimum 0 at 0."""
    return jnp.sum(x**2)


def ellipsoid(x: jax.Array) -> jax.Array:
    """``sum 10^(6 (i-1)/(D-1)) x_i^2`` (condition number 1e6); minimum 0 at 0."""
    d = x.shape[-1]
    exponents = 6.0 * np.arange(d) / max(d - 1, 1)
    return jnp.sum(jnp.asarray(10.0**exponents, x.dtype) * x**2)


def rosenbrock(x: jax.Array) -> jax.Array:
    """``sum 100 (x_{i+1} - x_i^2)^2 + (1 - x_i)^2``; minimum 0 at 1 (0 for D = 1 too)."""
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2) + (
        (1.0 - x[0]) ** 2 if x.shape[-1] == 1 else 0.0
    )


def rastrigin(x: jax.Array) -> jax.Array:
    """``10 D + sum (x_i^2 - 10 cos(2 pi x_i))``; minimum 0 at 0."""
    return 10.0 * x.shape[-1] + jnp.sum(x**2 - 10.0 * jnp.cos(2.0 * jnp.pi * x))


def ackley(x: jax.Array) -> jax.Array:
    """``-20 exp(-0.2 sqrt(mean x^2)) - exp(mean cos(2 pi x)) + 20 + e``; minimum 0 at 0."""
    # The square root is taken of mean + tiny so its derivative stays finite at 0.
    rms = jnp.sqrt(jnp.mean(x**2) + 1e-30)
    return -20.0 * jnp.exp(-0.2 * rms) - jnp.exp(jnp.mean(jnp.cos(2.0 * jnp.pi * x))) + 20.0 + jnp.e


def griewank(x: jax.Array) -> jax.Array:
    """``1 + sum x_i^2 / 4000 - prod cos(x_i / sqrt(i))``; minimum 0 at 0."""
    i = jnp.arange(1, x.shape[-1] + 1, dtype=x.dtype)
    return 1.0 + jnp.sum(x**2) / 4000.0 - jnp.prod(jnp.cos(x / jnp.sqrt(i)))


SCHWEFEL_ARGMIN = 420.9687463
SCHWEFEL_CONSTANT = 418.9829


def schwefel(x: jax.Array) -> jax.Array:
    """``418.9829 D - sum x_i sin(sqrt|x_i|)`` (Schwefel 2.26); minimum ~0 at 420.9687."""
    return SCHWEFEL_CONSTANT * x.shape[-1] - jnp.sum(x * jnp.sin(jnp.sqrt(jnp.abs(x))))


STYBLINSKI_TANG_ARGMIN = -2.903534018185960
STYBLINSKI_TANG_MIN_PER_DIM = -39.16616570377142


def styblinski_tang(x: jax.Array) -> jax.Array:
    """``sum (x_i^4 - 16 x_i^2 + 5 x_i) / 2``; minimum -39.16617 D at x_i = -2.903534."""
    return 0.5 * jnp.sum(x**4 - 16.0 * x**2 + 5.0 * x)


def _schwefel_min_per_dim() -> float:
    z = SCHWEFEL_ARGMIN
    return SCHWEFEL_CONSTANT - z * float(np.sin(np.sqrt(z)))


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A benchmark function and where its minimum lies (one coordinate repeated).

    Attributes:
      function: ``float32[dim] -> scalar``, the value to minimise.
      lower, upper: the conventional search box, per coordinate.
      argmin: every coordinate of the minimiser.
      min_per_dim: the minimum value divided by ``dim``.
    """

    function: Callable[[jax.Array], jax.Array]
    lower: float
    upper: float
    argmin: float = 0.0
    min_per_dim: float = 0.0


BENCHMARKS: dict[str, Benchmark] = {
    "sphere": Benchmark(sphere, -5.0, 5.0),
    "ellipsoid": Benchmark(ellipsoid, -5.0, 5.0),
    "rosenbrock": Benchmark(rosenbrock, -5.0, 10.0, argmin=1.0),
    "rastrigin": Benchmark(rastrigin, -5.12, 5.12),
    "ackley": Benchmark(ackley, -32.768, 32.768),
    "griewank": Benchmark(griewank, -600.0, 600.0),
    "schwefel": Benchmark(schwefel, -500.0, 500.0, SCHWEFEL_ARGMIN, _schwefel_min_per_dim()),
    "styblinski_tang": Benchmark(
        styblinski_tang, -5.0, 5.0, STYBLINSKI_TANG_ARGMIN, STYBLINSKI_TANG_MIN_PER_DIM
    ),
}


class BoxMinimisation:
    """What every benchmark task shares: start uniformly in ``[lower, upper]^dim``, fitness ``-function``.

    Subclasses provide ``function``, ``dim``, ``lower`` and ``upper``.
    """

    def init_params(self, key: jax.Array) -> jax.Array:
        """float32[dim], uniform in the search box."""
        return jax.random.uniform(key, (self.dim,), jnp.float32, self.lower, self.upper)

    def fitness(self, params: jax.Array, key: jax.Array) -> jax.Array:
        """``-function(params)`` (float32 scalar); ``key`` is unused."""
        del key
        return -self.function(params)


@dataclasses.dataclass(frozen=True)
class FunctionTask(BoxMinimisation):
    """Minimise ``function`` over ``[lower, upper]^dim``; fitness ``-function(x)``.

    A frozen, hashable config: pass ``task.fitness`` straight to ``es.evolve``.

    Attributes:
      name: the registered name.
      function: ``float32[dim] -> scalar``, the value to minimise.
      dim: number of parameters.
      lower, upper: the search box; ``init_params`` draws uniformly from it.
      argmin: every coordinate of the minimiser.
      min_per_dim: the minimum value divided by ``dim``.
    """

    name: str
    function: Callable[[jax.Array], jax.Array]
    dim: int
    lower: float
    upper: float
    argmin: float = 0.0
    min_per_dim: float = 0.0

    def optimum(self) -> np.ndarray:
        """float32[dim], the minimiser."""
        return np.full((self.dim,), self.argmin, np.float32)

    def optimal_value(self) -> float:
        """The minimum of ``function`` (the best fitness is its negation)."""
        return self.min_per_dim * self.dim


def check_dim(name: str, dim) -> int:
    """``dim`` as an int >= 1, or an error naming the task."""
    return validation.check_int(make_owner(name), "dim", dim, minimum=1, why="e.g. dim=10")


def _function_factory(name: str, benchmark: Benchmark) -> Callable[..., FunctionTask]:
    def factory(dim: int = 10) -> FunctionTask:
        return FunctionTask(name, benchmark.function, check_dim(name, dim), benchmark.lower,
                            benchmark.upper, benchmark.argmin, benchmark.min_per_dim)

    factory.__doc__ = f"{name}: {benchmark.function.__doc__}"
    return factory


for _name, _benchmark in BENCHMARKS.items():
    register(_name, _function_factory(_name, _benchmark))
