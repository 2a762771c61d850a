"""PGPE: policy gradients with parameter-based exploration (Sehnke et al. 2010, Neural Networks 23),
with symmetric sampling and the ClipUp optimizer (Toklu et al. 2020), as in EvoTorch.

A diagonal Gaussian ``N(mu, diag(sigma^2))`` sampled in symmetric pairs
``mu +- eps_j``, ``eps_j = sigma * z_j``. With shaped fitnesses ``f+_j, f-_j``
of pair ``j`` (centered ranks by default, so the baseline ``b``, their mean,
is 0) and ``n = popsize / 2`` pairs::

    g_mu    = 1/n * sum_j (f+_j - f-_j) / 2 * eps_j                  = sigma * Sums.linear / popsize
    g_sigma = 1/n * sum_j ((f+_j + f-_j) / 2 - b) * (eps_j^2 - sigma^2) / sigma
            = sigma * (Sums.square - sum_i b_i) / n                    with b_i = (f_i - b) / 2
    mu    <- mu + optimizer(g_mu)                                       (ClipUp by default)
    sigma <- clip(sigma + sigma_learning_rate * g_sigma, (1 -+ sigma_max_change) * sigma)
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax

from es import validation
from es.noise import GaussianNoise, NoiseSource
from es.strategies import optimizers, shaping
from es.strategies.base import Coefficients, PerCoordinate, Private, Step, Strategy, Sums, filled, optimizer_field


class PGPEState(NamedTuple):
    """PGPE's own state.

    Attributes:
      sigma: float[D], the per-coordinate scale (ravel order).
      opt_state: the optimizer's state for the mean (over the flat float[D] mean).
    """

    sigma: PerCoordinate[jax.Array]
    opt_state: Private[optax.OptState]


class PGPEHyperparameters(NamedTuple):
    """The traced hyperparameters."""

    sigma: float
    sigma_learning_rate: float
    sigma_max_change: float


@dataclasses.dataclass(frozen=True)
class PGPE(Strategy):
    """PGPE with symmetric sampling: adapts the mean with an optimizer and one scale per parameter.

    Args:
      popsize: members per generation (even: ``popsize / 2`` symmetric pairs).
      sigma: the initial scale of every parameter (> 0).
      optimizer: any ``optax.GradientTransformation`` for the mean (it sees
        the flat vector of the params); default
        ``es.clipup(learning_rate=0.15, max_speed=0.3)``, ClipUp's step
        lengths in params units (the paper's advice: ``learning_rate =
        max_speed / 2``; scale both with your params). The object is part
        of the compiled program and compares by identity: reuse one so that
        strategies differing only in their hyperparameters share one
        compilation.
      sigma_learning_rate: step of the scale update (>= 0; 0 keeps sigma
        fixed, one scale for every coordinate, and is what low-rank noise
        needs).
      sigma_max_change: largest relative change of sigma per generation.
      fitness_shaping: as for ``es.OpenES`` (default centered ranks).
      maximize: whether the fitness is to be maximised.
      noise: ``es.GaussianNoise()``, ``es.NoiseTable(...)`` or, with
        ``sigma_learning_rate=0``, ``es.LowRankNoise(...)``.
    """

    popsize: int
    sigma: float = 0.1
    optimizer: optax.GradientTransformation = optimizer_field("clipup", learning_rate=0.15, max_speed=0.3)
    sigma_learning_rate: float = 0.1
    sigma_max_change: float = 0.2
    fitness_shaping: str | shaping.ShapingFn = "centered_rank"
    maximize: bool = True
    noise: NoiseSource = GaussianNoise()
    adapts_sigma: bool = dataclasses.field(init=False, repr=False, metadata={
        "derived_from": "sigma_learning_rate", "why": "0 keeps sigma fixed: it switches part of its update off"})
    """``sigma_learning_rate != 0``: whether sigma is adapted. It shapes the program (``Sums.square`` or none), so
    it is static configuration, derived from the settings."""

    antithetic: ClassVar[bool] = True

    def __post_init__(self):
        self._set("sigma_learning_rate", validation.check_float(
            "PGPE", "sigma_learning_rate", self.sigma_learning_rate, minimum=0.0, example="0.1"))
        self._set("adapts_sigma", self.sigma_learning_rate != 0)
        self.check_common()
        validation.check_optimizer("PGPE", "optimizer", self.optimizer)
        self._set("sigma_max_change", validation.check_float(
            "PGPE", "sigma_max_change", self.sigma_max_change, positive=True, maximum=1.0, example="0.2"))
        shaping.check_shaping("PGPE", self.fitness_shaping)
        shaping.check_shaping_output("PGPE", self.fitness_shaping, self.popsize)
        self.check_noise_fits()

    @property
    def coordinatewise(self) -> bool:
        """With an optimizer declared coordinatewise (``es.optimizers.is_coordinatewise``; not the default ClipUp,
        whose steps are normalised by the norm over all coordinates)."""
        return optimizers.is_coordinatewise(self.optimizer)

    def hyperparameters(self, dim: int) -> PGPEHyperparameters:
        return PGPEHyperparameters(self.sigma, self.sigma_learning_rate, self.sigma_max_change)

    # ---------------------------------------------------------------- the maths

    def initial_state(self, hp: PGPEHyperparameters, mean: jax.Array) -> PGPEState:
        return PGPEState(sigma=filled(mean.shape, hp.sigma, mean.dtype), opt_state=self.optimizer.init(mean))

    def scale(self, hp: PGPEHyperparameters, state: PGPEState, generation: jax.Array) -> jax.Array:
        if not self.adapts_sigma:  # sigma never changes: one scale for every coordinate
            return jnp.asarray(hp.sigma, jnp.result_type(float))
        return state.sigma

    def coefficients(self, hp, state: PGPEState, fitness: jax.Array) -> Coefficients:
        weights, _ = shaping.shape_fitness(fitness, self.fitness_shaping, self.maximize)
        if not self.adapts_sigma:
            return Coefficients(linear=weights)
        return Coefficients(linear=weights, square=(weights - jnp.mean(weights)) / 2)

    def update(self, hp: PGPEHyperparameters, state: PGPEState, mean: jax.Array, coefficients: Coefficients,
               sums: Sums, generation: jax.Array) -> Step:
        sigma = state.sigma
        grad_mean = sigma * sums.linear / self.popsize
        updates, opt_state = self.optimizer.update(-grad_mean, state.opt_state, mean)
        if self.adapts_sigma:
            grad_sigma = sigma * (sums.square - jnp.sum(coefficients.square)) / (self.popsize // 2)
            limit = hp.sigma_max_change * sigma
            sigma = jnp.clip(sigma + hp.sigma_learning_rate * grad_sigma, sigma - limit, sigma + limit)
        return Step(optax.apply_updates(mean, updates), PGPEState(sigma, opt_state), grad_mean, updates)
