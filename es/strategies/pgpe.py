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
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from es.noise import sources as noise_lib
from es import validation
from es.strategies import optimizers
from es.strategies import shaping
from es.strategies.base import Coefficients, State, Strategy, Sums, optimizer_field


class PGPEState(NamedTuple):
    """PGPE's own state.

    Attributes:
      sigma: float32[D], the per-coordinate scale (ravel order).
      opt_state: the optimizer's state for the mean.
    """

    sigma: jax.Array
    opt_state: optax.OptState


@dataclasses.dataclass(frozen=True)
class PGPE(Strategy):
    """PGPE with symmetric sampling: adapts the mean with an optimizer and one scale per parameter.

    Args:
      popsize: members per generation (even: ``popsize / 2`` symmetric pairs).
      sigma: the initial scale of every parameter (> 0).
      optimizer: any ``optax.GradientTransformation`` for the mean; default
        ``es.clipup(learning_rate=0.15, max_speed=0.3)``, ClipUp's step
        lengths in params units (the paper's advice: ``learning_rate =
        max_speed / 2``; scale both with your params).
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
    noise: noise_lib.NoiseSource = noise_lib.GaussianNoise()

    antithetic: ClassVar[bool] = True

    def __post_init__(self):
        self._set("sigma_learning_rate", validation.check_float(
            "PGPE", "sigma_learning_rate", self.sigma_learning_rate, minimum=0.0, example="0.1"))
        self.check_common()
        validation.check_optimizer("PGPE", "optimizer", self.optimizer)
        self._set("sigma_max_change", validation.check_float(
            "PGPE", "sigma_max_change", self.sigma_max_change, positive=True, maximum=1.0, example="0.2"))
        validation.check_shaping("PGPE", self.fitness_shaping)

    switches: ClassVar[tuple[str, ...]] = ("sigma_learning_rate",)  # 0: sigma fixed, no Sums.square

    @property
    def uses_squares(self) -> bool:
        """Whether sigma is adapted (it needs ``Sums.square``); ``sigma_learning_rate=0`` keeps it fixed."""
        return self.switched_on("sigma_learning_rate")

    private_state: ClassVar[tuple[str, ...]] = ("opt_state",)

    @property
    def coordinatewise(self) -> bool:
        """With a coordinatewise optimizer (``es.optimizers.coordinatewise``; not the default ClipUp, whose
        steps are normalised by the norm over all coordinates)."""
        return optimizers.coordinatewise(self.optimizer)

    def low_rank_fix(self) -> str:
        return "Pass sigma_learning_rate=0 to keep sigma fixed (low-rank noise then perturbs the mean only)."

    def check_run(self, dim: int) -> None:
        validation.check_shaping_output("PGPE", self.fitness_shaping, self.popsize)

    # ---------------------------------------------------------------- the maths

    def initial_state(self, params: Any) -> PGPEState:
        flat, _ = ravel_pytree(params)
        return PGPEState(sigma=jnp.full(flat.shape, self.sigma, jnp.float32), opt_state=self.optimizer.init(params))

    def scale(self, strategy_state: PGPEState, generation: jax.Array) -> jax.Array:
        if not self.uses_squares:  # sigma never changes: one scale for every coordinate
            return jnp.asarray(self.sigma, jnp.float32)
        return strategy_state.sigma

    def coefficients(self, strategy_state: PGPEState, fitness: jax.Array) -> Coefficients:
        weights, _ = shaping.shape_fitness(fitness, self.fitness_shaping, self.maximize)
        if not self.uses_squares:
            return Coefficients(linear=weights)
        return Coefficients(linear=weights, square=(weights - jnp.mean(weights)) / 2)

    def update(self, state: State, coefficients: Coefficients, sums: Sums):
        flat, unravel = ravel_pytree(state.params)
        sigma = state.strategy_state.sigma
        grad_mean = sigma * sums.linear / self.popsize
        updates, opt_state = self.optimizer.update(
            unravel((-grad_mean).astype(flat.dtype)), state.strategy_state.opt_state, state.params
        )
        params = optax.apply_updates(state.params, updates)
        if self.uses_squares:
            grad_sigma = sigma * (sums.square - jnp.sum(coefficients.square)) / (self.popsize // 2)
            limit = self.sigma_max_change * sigma
            sigma = jnp.clip(sigma + self.sigma_learning_rate * grad_sigma, sigma - limit, sigma + limit)
        return params, PGPEState(sigma, opt_state), {"grad_norm": grad_mean, "update_norm": updates}
