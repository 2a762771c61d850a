"""SNES: separable natural evolution strategy (Schaul et al. 2011, "High dimensions and heavy tails for
natural evolution strategies"; Wierstra et al. 2014, "Natural evolution strategies", JMLR 15).

A diagonal Gaussian ``N(mu, diag(sigma^2))``. Members ``mu + sigma * z_i``,
``z_i ~ N(0, I)``. Utilities from ranks (``k = 1`` the best of ``lambda``
members; tied members share the mean of their ranks' utilities)::

    u_k = max(0, log(lambda/2 + 1) - log k) / sum_l max(0, log(lambda/2 + 1) - log l) - 1/lambda

and the natural-gradient steps (``Sums.linear`` with ``a_i = u_i``,
``Sums.square`` with ``b_i = u_i``)::

    mu    <- mu + eta_mu * sigma * sum_i u_i z_i
    sigma <- sigma * exp(eta_sigma / 2 * sum_i u_i (z_i^2 - 1))

Defaults ``eta_mu = 1`` and ``eta_sigma = (3 + ln d) / (5 sqrt d)`` for ``d``
parameters, as in both papers.

With ``temperature=t`` the utilities are instead the recombination weights of
Lange et al. (2023, "Discovering evolution strategies via meta-black-box
optimization"), evosax's ``SNES(temperature=...)`` that NeuroEvoBench tuned
(Breakout: ``t = 30``). With ``r_k = (k - 1) / (lambda - 1) - 1/2``::

    u_k = softmax_k(-20 * sigmoid(t * r_k))       # positive, sum to 1

A large ``t`` weighs the better half of the members almost equally and the
worse half not at all (truncation selection).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from es import validation
from es.noise import GaussianNoise, NoiseSource
from es.strategies import shaping
from es.strategies.base import Coefficients, PerCoordinate, Step, Strategy, Sums, added_later, filled


class SNESState(NamedTuple):
    """SNES's own state: the per-coordinate scale ``sigma`` (float[D], ravel order)."""

    sigma: PerCoordinate[jax.Array]


class SNESHyperparameters(NamedTuple):
    """SNES's traced hyperparameters: the initial scale, ``eta_mu``, ``eta_sigma`` (resolved for ``D``) and the
    temperature (``None``: NES's utilities)."""

    sigma: float
    learning_rate: float
    sigma_learning_rate: float
    temperature: float | None


def utilities(popsize: int, temperature: float | jax.Array | None = None) -> jax.Array:
    """float32[popsize]: the utility of each rank, best first (NES's: they sum to 0; with a
    ``temperature``, the discovered weights of Lange et al. 2023: positive, they sum to 1)."""
    if temperature is not None:
        centred = jnp.arange(popsize, dtype=jnp.float32) / (popsize - 1) - 0.5
        return jax.nn.softmax(-20.0 * jax.nn.sigmoid(temperature * centred))
    ranks = jnp.arange(1, popsize + 1, dtype=jnp.float32)
    raw = jnp.maximum(0.0, math.log(popsize / 2 + 1) - jnp.log(ranks))
    return raw / jnp.sum(raw) - 1.0 / popsize


@dataclasses.dataclass(frozen=True)
class SNES(Strategy):
    """Separable natural evolution strategy: adapts one scale per parameter.

    Args:
      popsize: members per generation (>= 2; even when ``antithetic``). The
        papers' default is ``4 + 3 ln d``; large policies want hundreds.
      sigma: the initial scale of every parameter (> 0).
      learning_rate: ``eta_mu``, the step of the mean (> 0; 1 in the papers).
      sigma_learning_rate: ``eta_sigma`` (> 0), or ``None`` for
        ``(3 + ln d) / (5 sqrt d)``.
      antithetic: sample mirrored pairs ``mu +- sigma z``.
      maximize: whether the fitness is to be maximised.
      noise: ``es.GaussianNoise()`` or ``es.NoiseTable(...)``.
      temperature: ``None`` for NES's utilities, or ``t > 0`` for the
        discovered weights above (evosax's SNES ``temperature``; 12-30 are
        typical, larger is closer to equal weights on the better half).
    """

    popsize: int
    sigma: float = 0.1
    learning_rate: float = 1.0
    sigma_learning_rate: float | None = None
    antithetic: bool = False
    maximize: bool = True
    noise: NoiseSource = GaussianNoise()
    temperature: float | None = added_later(None)  # SNES runs checkpointed before it existed still resume

    coordinatewise = True

    def __post_init__(self):
        self.check_common()
        self._set("learning_rate", validation.check_float("SNES", "learning_rate", self.learning_rate, positive=True))
        self._set("sigma_learning_rate", validation.check_optional_float(
            "SNES", "sigma_learning_rate", self.sigma_learning_rate, positive=True, example="0.1, or None"))
        self._set("temperature", validation.check_optional_float(
            "SNES", "temperature", self.temperature, positive=True, example="30.0, or None"))
        self.check_noise_fits()

    def hyperparameters(self, dim: int) -> SNESHyperparameters:
        """``eta_sigma`` defaults to ``(3 + ln D) / (5 sqrt D)`` for the whole ``D`` (a slice's update uses it too)."""
        rate = self.sigma_learning_rate
        if rate is None:
            rate = (3 + math.log(dim)) / (5 * math.sqrt(dim))
        return SNESHyperparameters(self.sigma, self.learning_rate, rate, self.temperature)

    # ---------------------------------------------------------------- the maths

    def initial_state(self, hp: SNESHyperparameters, mean: jax.Array) -> SNESState:
        return SNESState(sigma=filled(mean.shape, hp.sigma, mean.dtype))

    def scale(self, hp: SNESHyperparameters, state: SNESState, generation: jax.Array) -> jax.Array:
        return state.sigma

    def coefficients(self, hp: SNESHyperparameters, state: SNESState, fitness: jax.Array) -> Coefficients:
        temperature = None if self.temperature is None else hp.temperature
        u = shaping.rank_weights(fitness, utilities(self.popsize, temperature), self.maximize)
        return Coefficients(linear=u, square=u)

    def update(self, hp: SNESHyperparameters, state: SNESState, mean: jax.Array, coefficients: Coefficients,
               sums: Sums, generation: jax.Array) -> Step:
        grad_mean = sums.linear  # sum_i u_i z_i
        grad_sigma = sums.square - jnp.sum(coefficients.square)  # sum_i u_i (z_i^2 - 1)
        step = hp.learning_rate * state.sigma * grad_mean
        sigma = state.sigma * jnp.exp(0.5 * hp.sigma_learning_rate * grad_sigma)
        return Step(mean + step, SNESState(sigma), grad_mean, step)

    def stop_conditions(self, hp, state: SNESState, mean, generation, criteria) -> dict[str, jax.Array]:
        return {"tolx": jnp.all(state.sigma < criteria.tolx)}
