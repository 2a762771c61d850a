"""OpenAI-ES (Salimans et al. 2017, "Evolution strategies as a scalable alternative to reinforcement learning").

An isotropic Gaussian ``N(theta, sigma^2 I)`` whose mean follows any optax
optimizer. With members ``theta + sigma * s_i * eps_i`` and shaped fitnesses
``w_i`` (centered ranks by default)::

    g     = 1 / (popsize * sigma) * sum_i w_i * s_i * eps_i       # Sums.linear with a_i = w_i
    theta <- theta + optimizer(-g + weight_decay * theta)          # optax minimises

With antithetic sampling the members come in pairs ``+eps_j, -eps_j``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from es.noise import sources as noise_lib
from es import validation
from es.strategies import optimizers
from es.strategies import shaping
from es.strategies.base import Coefficients, Schedule, State, Strategy, Sums, optimizer_field


class OpenESState(NamedTuple):
    """OpenAI-ES's own state: the optimizer's state for the mean."""

    opt_state: optax.OptState


@dataclasses.dataclass(frozen=True)
class OpenES(Strategy):
    """OpenAI evolution strategy (Salimans et al. 2017).

    Args:
      popsize: members per generation (>= 2; even when ``antithetic``).
      sigma: perturbation scale (> 0), or a schedule ``generation -> sigma``
        such as an ``optax`` schedule.
      optimizer: any ``optax.GradientTransformation``; it receives the
        negated gradient estimate (optax minimises). Default ``adam(1e-2)``.
      antithetic: evaluate pairs ``theta +- sigma * eps`` (halves noise draws
        and reduces variance).
      fitness_shaping: ``"centered_rank"``, ``"z_score"``, ``"raw"`` or a
        callable ``float32[popsize] -> float32[popsize]`` (higher is better).
      weight_decay: L2 coefficient ``c >= 0``; adds ``c * theta`` to the
        gradient handed to the optimizer.
      maximize: whether ``fitness_fn`` is to be maximised.
      noise: where perturbations come from: ``es.GaussianNoise()`` (fresh
        ``jax.random.normal`` draws, default) or ``es.NoiseTable(size,
        seed)`` (slices of a shared table: several times faster, see
        docs/benchmarks.md).
    """

    popsize: int
    sigma: float | Schedule = 0.05
    optimizer: optax.GradientTransformation = optimizer_field("adam", learning_rate=1e-2)
    antithetic: bool = True
    fitness_shaping: str | shaping.ShapingFn = "centered_rank"
    weight_decay: float = 0.0
    maximize: bool = True
    noise: noise_lib.NoiseSource = noise_lib.GaussianNoise()

    def __post_init__(self):
        self._set("sigma", validation.check_float_or_schedule("OpenES", "sigma", self.sigma, "0.05"))
        self.check_common()
        validation.check_optimizer("OpenES", "optimizer", self.optimizer)
        validation.check_shaping("OpenES", self.fitness_shaping)
        self._set("weight_decay", validation.check_float("OpenES", "weight_decay", self.weight_decay, minimum=0.0))

    private_state: ClassVar[tuple[str, ...]] = ("opt_state",)

    @property
    def coordinatewise(self) -> bool:
        """With a coordinatewise optimizer (``es.optimizers.coordinatewise``: the default Adam)."""
        return optimizers.coordinatewise(self.optimizer)

    def check_run(self, dim: int) -> None:
        validation.check_shaping_output("OpenES", self.fitness_shaping, self.popsize)
        validation.check_schedule("OpenES", "sigma", self.sigma)

    def sigma_at(self, generation: jax.Array) -> jax.Array:
        """Perturbation scale (float32 scalar) of generation ``generation``."""
        sigma = self.sigma(generation) if callable(self.sigma) else self.sigma
        return jnp.asarray(sigma, jnp.float32)

    # ---------------------------------------------------------------- the maths

    def initial_state(self, params: Any) -> OpenESState:
        return OpenESState(opt_state=self.optimizer.init(params))

    def scale(self, strategy_state: OpenESState, generation: jax.Array) -> jax.Array:
        return self.sigma_at(generation)

    def coefficients(self, strategy_state: OpenESState, fitness: jax.Array) -> Coefficients:
        weights, _ = shaping.shape_fitness(fitness, self.fitness_shaping, self.maximize)
        return Coefficients(linear=weights)

    def update(self, state: State, coefficients: Coefficients, sums: Sums):
        flat, unravel = ravel_pytree(state.params)
        grad = sums.linear / (self.popsize * self.sigma_at(state.generation))
        grad = jnp.where(jnp.isfinite(grad), grad, 0.0)
        loss_grad = -grad + self.weight_decay * flat.astype(jnp.float32)
        updates, opt_state = self.optimizer.update(
            unravel(loss_grad.astype(flat.dtype)), state.strategy_state.opt_state, state.params
        )
        params = optax.apply_updates(state.params, updates)
        return params, OpenESState(opt_state), {"grad_norm": grad, "update_norm": updates}
