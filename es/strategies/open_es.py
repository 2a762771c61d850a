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
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from es import validation
from es.noise import GaussianNoise, NoiseSource
from es.strategies import optimizers, shaping
from es.strategies.base import Coefficients, Private, Schedule, Step, Strategy, Sums, optimizer_field


class OpenESState(NamedTuple):
    """OpenAI-ES's own state: the optimizer's state for the mean (over the flat float[D] mean)."""

    opt_state: Private[optax.OptState]


class OpenESHyperparameters(NamedTuple):
    """The traced hyperparameters: ``sigma`` (``None`` when it is a schedule) and the weight decay."""

    sigma: float | None
    weight_decay: float


@dataclasses.dataclass(frozen=True)
class OpenES(Strategy):
    """OpenAI evolution strategy (Salimans et al. 2017).

    Args:
      popsize: members per generation (>= 2; even when ``antithetic``).
      sigma: perturbation scale (> 0), or a schedule ``generation -> sigma``
        such as an ``optax`` schedule.
      optimizer: any ``optax.GradientTransformation``; it receives the
        negated gradient estimate (optax minimises) over the flat vector of
        the params. Default ``adam(1e-2)``. Declared coordinatewise
        (``es.optimizers.make``'s, or ``es.optimizers.coordinatewise(...)``),
        ``exchange="sharded"`` splits its update over the devices. The
        object is part of the compiled program and compares by identity:
        reuse one (``es.optimizers.make`` shares one per arguments) so that
        strategies differing only in ``sigma`` share one compilation.
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
    noise: NoiseSource = GaussianNoise()

    def __post_init__(self):
        self._set("sigma", validation.check_float_or_schedule("OpenES", "sigma", self.sigma, "0.05"))
        self.check_common()
        validation.check_optimizer("OpenES", "optimizer", self.optimizer)
        shaping.check_shaping("OpenES", self.fitness_shaping)
        self._set("weight_decay", validation.check_float("OpenES", "weight_decay", self.weight_decay, minimum=0.0))
        shaping.check_shaping_output("OpenES", self.fitness_shaping, self.popsize)
        validation.check_schedule("OpenES", "sigma", self.sigma)

    @property
    def coordinatewise(self) -> bool:
        """With an optimizer declared coordinatewise (``es.optimizers.is_coordinatewise``: the default Adam)."""
        return optimizers.is_coordinatewise(self.optimizer)

    def hyperparameters(self, dim: int) -> OpenESHyperparameters:
        return OpenESHyperparameters(None if callable(self.sigma) else self.sigma, self.weight_decay)

    def sigma_at(self, hp: OpenESHyperparameters, generation: jax.Array) -> jax.Array:
        """Perturbation scale (scalar) of generation ``generation``."""
        sigma = self.sigma(generation) if callable(self.sigma) else hp.sigma
        return jnp.asarray(sigma, jnp.result_type(float))

    # ---------------------------------------------------------------- the maths

    def initial_state(self, hp: OpenESHyperparameters, mean: jax.Array) -> OpenESState:
        return OpenESState(opt_state=self.optimizer.init(mean))

    def scale(self, hp: OpenESHyperparameters, state: OpenESState, generation: jax.Array) -> jax.Array:
        return self.sigma_at(hp, generation)

    def coefficients(self, hp, state: OpenESState, fitness: jax.Array) -> Coefficients:
        weights, _ = shaping.shape_fitness(fitness, self.fitness_shaping, self.maximize)
        return Coefficients(linear=weights)

    def update(self, hp: OpenESHyperparameters, state: OpenESState, mean: jax.Array, coefficients: Coefficients,
               sums: Sums, generation: jax.Array) -> Step:
        grad = sums.linear / (self.popsize * self.sigma_at(hp, generation))
        grad = jnp.where(jnp.isfinite(grad), grad, 0.0)
        loss_grad = -grad + hp.weight_decay * mean
        updates, opt_state = self.optimizer.update(loss_grad, state.opt_state, mean)
        return Step(optax.apply_updates(mean, updates), OpenESState(opt_state), grad, updates)
