"""ARS: augmented random search (Mania et al. 2018, "Simple random search of static linear policies is
competitive for reinforcement learning"), V1-t; V2-t when the fitness normalises observations.

``N = popsize / 2`` directions ``delta_j ~ N(0, I)`` are evaluated at
``theta +- nu * delta_j`` (``nu`` = ``sigma``) with returns ``r+_j, r-_j``.
The ``b = top_k`` directions with the largest ``max(r+_j, r-_j)`` are kept
(directions tied at the cut share the remaining places equally) and::

    theta <- theta + alpha / (b * sigma_R) * sum_{j in top b} (r+_j - r-_j) * delta_j

with ``alpha`` = ``learning_rate`` and ``sigma_R`` the standard deviation of
the ``2b`` returns used (``Sums.linear`` with ``a_2j = -a_2j+1 = (r+_j - r-_j)
/ (2 b sigma_R)``). V2 normalises the policy's observations with running
statistics: pass a fitness that does, such as the env tasks'
``obs_norm=True`` (``es.StatefulFitness``).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from es import validation
from es.noise import GaussianNoise, NoiseSource
from es.strategies import shaping
from es.strategies.base import Coefficients, Step, Strategy, Sums


class ARSState(NamedTuple):
    """ARS keeps no state besides the mean (an empty tuple)."""


class ARSHyperparameters(NamedTuple):
    """The traced hyperparameters: ``nu`` and ``alpha``."""

    sigma: float
    learning_rate: float


@dataclasses.dataclass(frozen=True)
class ARS(Strategy):
    """Augmented random search: plain steps along the best directions, scaled by the returns' spread.

    Args:
      popsize: members per generation (even: ``popsize / 2`` directions).
      sigma: ``nu``, the exploration noise (> 0); constant.
      top_k: ``b``, the directions kept per generation, in ``[1, popsize/2]``;
        ``None`` keeps all of them (ARS V1 without top-b selection).
      learning_rate: ``alpha``, the step size (> 0).
      maximize: whether the fitness is to be maximised.
      noise: ``es.GaussianNoise()`` or ``es.NoiseTable(...)``.
    """

    popsize: int
    sigma: float = 0.02
    top_k: int | None = None
    learning_rate: float = 0.02
    maximize: bool = True
    noise: NoiseSource = GaussianNoise()

    antithetic: ClassVar[bool] = True
    coordinatewise = True

    def __post_init__(self):
        self.check_common()
        if self.top_k is not None:
            validation.check_int("ARS", "top_k", self.top_k, 1, "it counts the directions kept")
            if self.top_k > self.popsize // 2:
                raise ValueError(
                    f"ARS(top_k={self.top_k}, popsize={self.popsize}): top_k counts directions, and there are "
                    f"popsize/2 = {self.popsize // 2}; use top_k <= {self.popsize // 2} or None (all)."
                )
        self._set("learning_rate", validation.check_float("ARS", "learning_rate", self.learning_rate, positive=True))

    @property
    def num_directions(self) -> int:
        return self.popsize // 2

    def hyperparameters(self, dim: int) -> ARSHyperparameters:
        return ARSHyperparameters(self.sigma, self.learning_rate)

    # ---------------------------------------------------------------- the maths

    def initial_state(self, hp, mean: jax.Array) -> ARSState:
        return ARSState()

    def scale(self, hp: ARSHyperparameters, state: ARSState, generation: jax.Array) -> jax.Array:
        return jnp.asarray(hp.sigma, jnp.result_type(float))

    def coefficients(self, hp, state: ARSState, fitness: jax.Array) -> Coefficients:
        returns, _ = shaping.sanitize(fitness, self.maximize)
        plus, minus = returns[0::2], returns[1::2]
        b = self.top_k or self.num_directions
        kept = shaping.top_k_weights(jnp.maximum(plus, minus), b)  # 1, 0, or a share of a tie at the cut
        mean = jnp.sum(kept * (plus + minus)) / (2 * b)
        sigma_r = jnp.sqrt(jnp.sum(kept * ((plus - mean) ** 2 + (minus - mean) ** 2)) / (2 * b))
        half = jnp.where(sigma_r > 0, kept * (plus - minus) / (2 * b * jnp.where(sigma_r > 0, sigma_r, 1.0)), 0.0)
        return Coefficients(linear=jnp.stack([half, -half], axis=1).reshape(-1))

    def update(self, hp: ARSHyperparameters, state: ARSState, mean: jax.Array, coefficients: Coefficients,
               sums: Sums, generation: jax.Array) -> Step:
        step = hp.learning_rate * sums.linear
        return Step(mean + step, ARSState(), sums.linear, step)
