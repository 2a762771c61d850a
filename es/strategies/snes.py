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

import copy
import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from es.noise import sources as noise_lib
from es import validation
from es.strategies import shaping
from es.strategies.base import Coefficients, State, Strategy, Sums


class SNESState(NamedTuple):
    """SNES's own state: the per-coordinate scale ``sigma`` (float32[D], ravel order)."""

    sigma: jax.Array


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
    noise: noise_lib.NoiseSource = noise_lib.GaussianNoise()
    temperature: float | None = None

    uses_squares = True
    later_fields = {"temperature": None}  # SNES runs checkpointed before it existed still resume

    def __post_init__(self):
        self.check_common()
        self._set("learning_rate", validation.check_float("SNES", "learning_rate", self.learning_rate, positive=True))
        self._set("sigma_learning_rate", validation.check_optional_float(
            "SNES", "sigma_learning_rate", self.sigma_learning_rate, positive=True, example="0.1, or None"))
        self._set("temperature", validation.check_optional_float(
            "SNES", "temperature", self.temperature, positive=True, example="30.0, or None"))

    coordinatewise = True

    def for_slice(self, dim: int) -> "SNES":
        """The default ``eta_sigma`` depends on ``D``: a slice's update uses the whole's."""
        if self.sigma_learning_rate is not None:
            return self
        sliced = copy.copy(self)  # like with_hyperparameters: no __init__, its checks passed
        sliced._set("sigma_learning_rate", self.sigma_rate(dim))
        return sliced

    def sigma_rate(self, dim: int) -> float | jax.Array:
        """``eta_sigma`` for ``dim`` parameters."""
        if self.sigma_learning_rate is not None:
            return self.sigma_learning_rate
        return (3 + math.log(dim)) / (5 * math.sqrt(dim))

    # ---------------------------------------------------------------- the maths

    def initial_state(self, params: Any) -> SNESState:
        flat, _ = ravel_pytree(params)
        return SNESState(sigma=jnp.full(flat.shape, self.sigma, jnp.float32))

    def scale(self, strategy_state: SNESState, generation: jax.Array) -> jax.Array:
        return strategy_state.sigma

    def coefficients(self, strategy_state: SNESState, fitness: jax.Array) -> Coefficients:
        u = shaping.rank_weights(fitness, utilities(self.popsize, self.temperature), self.maximize)
        return Coefficients(linear=u, square=u)

    def update(self, state: State, coefficients: Coefficients, sums: Sums):
        flat, unravel = ravel_pytree(state.params)
        sigma = state.strategy_state.sigma
        grad_mean = sums.linear  # sum_i u_i z_i
        grad_sigma = sums.square - jnp.sum(coefficients.square)  # sum_i u_i (z_i^2 - 1)
        step = self.learning_rate * sigma * grad_mean
        params = unravel((flat.astype(jnp.float32) + step).astype(flat.dtype))
        sigma = sigma * jnp.exp(0.5 * self.sigma_rate(flat.shape[0]) * grad_sigma)
        return params, SNESState(sigma), {"grad_norm": grad_mean, "update_norm": step}
