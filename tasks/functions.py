"""Benchmark functions as tasks: the fitness is the negated function value (maximum 0)."""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from tasks.registry import register


def sphere(x: jax.Array) -> jax.Array:
    """``sum x_i^2``; minimum 0 at 0."""
    return jnp.sum(x**2)


def rastrigin(x: jax.Array) -> jax.Array:
    """``10 D + sum (x_i^2 - 10 cos(2 pi x_i))``; minimum 0 at 0."""
    return 10.0 * x.shape[-1] + jnp.sum(x**2 - 10.0 * jnp.cos(2.0 * jnp.pi * x))


@dataclasses.dataclass(frozen=True)
class FunctionTask:
    """Minimise ``function`` over ``[lower, upper]^dim``; fitness ``-function(x)``.

    Attributes:
      name: the registered name.
      function: ``float32[dim] -> scalar``, the value to minimise.
      dim: number of parameters.
      lower, upper: the search box; ``init_params`` draws uniformly from it.
    """

    name: str
    function: Callable[[jax.Array], jax.Array]
    dim: int
    lower: float
    upper: float

    def init_params(self, key: jax.Array) -> jax.Array:
        """float32[dim], uniform in the search box."""
        return jax.random.uniform(key, (self.dim,), jnp.float32, self.lower, self.upper)

    def fitness(self, params: jax.Array, key: jax.Array) -> jax.Array:
        """``-function(params)`` (float32 scalar); ``key`` is unused."""
        del key
        return -self.function(params)


def _function_factory(name: str, function: Callable, lower: float, upper: float) -> Callable[..., FunctionTask]:
    def factory(dim: int = 10) -> FunctionTask:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"tasks.make({name!r}, dim={dim!r}): dim must be a positive int.")
        return FunctionTask(name, function, dim, lower, upper)

    return factory


register("sphere", _function_factory("sphere", sphere, -5.0, 5.0))
register("rastrigin", _function_factory("rastrigin", rastrigin, -5.12, 5.12))
