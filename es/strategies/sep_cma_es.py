"""Separable CMA-ES (Ros & Hansen 2008, "A simple modification in CMA-ES achieving linear time and space
complexity", PPSN X), with cumulative step-size adaptation; constants as in Hansen's tutorial
(arXiv:1604.00772) and the ``cmaes`` library's ``SepCMA``.

The distribution is ``N(m, sigma^2 diag(C))``; members ``m + sigma * sqrt(C) * z_i``.
With ``mu = lambda / 2`` recombination weights ``w_k = ln(mu + 1) - ln k``
(normalised, ``k = 1`` the best; zero beyond ``mu``; tied members share the
mean of their ranks' weights), ``Sums.linear = sum_i w_i z_i`` and
``Sums.square = sum_i w_i z_i^2`` (``a_i = b_i = w_i``)::

    y_w     = sqrt(C) * Sums.linear
    m       <- m + sigma * y_w
    p_sigma <- (1 - c_sigma) p_sigma + sqrt(c_sigma (2 - c_sigma) mu_eff) * Sums.linear
    sigma   <- sigma * exp(c_sigma / d_sigma * (|p_sigma| / E|N(0, I)| - 1))
    p_c     <- (1 - c_c) p_c + h_sigma sqrt(c_c (2 - c_c) mu_eff) * y_w
    C       <- (1 + c_1 dh - c_1 - c_mu sum w) C + c_1 p_c^2 + c_mu C * Sums.square

with ``h_sigma`` the stall indicator of ``|p_sigma|`` and ``dh = (1 - h_sigma)
c_c (2 - c_c)``. The rank-mu rate is the full CMA-ES one scaled by ``(n + 2)
/ 3``, the separable version's faster learning of a diagonal.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from es.noise import sources as noise_lib
from es.strategies import shaping
from es.strategies.base import Coefficients, State, Strategy, Sums


class SepCMAESState(NamedTuple):
    """Sep-CMA-ES's own state (vectors float32[D] in ravel order).

    Attributes:
      sigma: float32 scalar, the global step size.
      cov: the diagonal ``C`` of the covariance.
      path_sigma: ``p_sigma``, the conjugate evolution path.
      path_cov: ``p_c``, the evolution path of ``C``.
    """

    sigma: jax.Array
    cov: jax.Array
    path_sigma: jax.Array
    path_cov: jax.Array


class Constants(NamedTuple):
    """The learning rates and normalisers of sep-CMA-ES for ``n`` parameters and ``lambda`` members."""

    weights: jax.Array
    mu_eff: float
    c_sigma: float
    d_sigma: float
    c_c: float
    c_1: float
    c_mu: float
    chi_n: float


def constants(dim: int, popsize: int) -> Constants:
    n, mu = dim, popsize // 2
    raw = [math.log(mu + 1) - math.log(k) for k in range(1, mu + 1)]
    weights = [w / sum(raw) for w in raw]
    mu_eff = 1.0 / sum(w * w for w in weights)
    c_1 = 2.0 / ((n + 1.3) ** 2 + mu_eff)
    c_mu_full = 2.0 / mu_eff / (n + math.sqrt(2)) ** 2 + (1 - 1 / mu_eff) * min(
        1.0, (2 * mu_eff - 1) / ((n + 2) ** 2 + mu_eff)
    )
    c_sigma = (mu_eff + 2) / (n + mu_eff + 3)
    return Constants(
        weights=jnp.asarray(weights + [0.0] * (popsize - mu), jnp.float32),
        mu_eff=mu_eff,
        c_sigma=c_sigma,
        d_sigma=1 + 2 * max(0.0, math.sqrt((mu_eff - 1) / (n + 1)) - 1) + c_sigma,
        c_c=4.0 / (n + 4),
        c_1=c_1,
        c_mu=min(1 - c_1, (n + 2) / 3 * c_mu_full),
        chi_n=math.sqrt(n) * (1 - 1 / (4 * n) + 1 / (21 * n * n)),
    )


@dataclasses.dataclass(frozen=True)
class SepCMAES(Strategy):
    """Separable CMA-ES: a global step size and a diagonal covariance, both adapted.

    Args:
      popsize: ``lambda``, members per generation (>= 4; the papers' default
        is ``4 + 3 ln n``). The best half recombine.
      sigma: the initial global step size (> 0).
      antithetic: sample mirrored pairs (off in the papers).
      maximize: whether the fitness is to be maximised.
      noise: ``es.GaussianNoise()`` or ``es.NoiseTable(...)``.
    """

    popsize: int
    sigma: float = 0.1
    antithetic: bool = False
    maximize: bool = True
    noise: noise_lib.NoiseSource = noise_lib.GaussianNoise()

    uses_squares = True

    def __post_init__(self):
        self.check_common()
        if self.popsize < 4:
            raise ValueError(
                f"SepCMAES(popsize={self.popsize}): popsize must be at least 4 (the best half recombine, "
                "and the weights need two members); use popsize=4 or more."
            )

    # ---------------------------------------------------------------- the maths

    def initial_state(self, params: Any) -> SepCMAESState:
        flat, _ = ravel_pytree(params)
        zeros = jnp.zeros(flat.shape, jnp.float32)
        return SepCMAESState(jnp.asarray(self.sigma, jnp.float32), jnp.ones(flat.shape, jnp.float32), zeros, zeros)

    def scale(self, strategy_state: SepCMAESState, generation: jax.Array) -> jax.Array:
        return strategy_state.sigma * jnp.sqrt(strategy_state.cov)

    def coefficients(self, strategy_state: SepCMAESState, fitness: jax.Array) -> Coefficients:
        weights = shaping.rank_weights(fitness, constants(strategy_state.cov.shape[0], self.popsize).weights,
                                       self.maximize)
        return Coefficients(linear=weights, square=weights)

    def update(self, state: State, coefficients: Coefficients, sums: Sums):
        flat, unravel = ravel_pytree(state.params)
        sigma, cov, path_sigma, path_cov = state.strategy_state
        k = constants(flat.shape[0], self.popsize)
        y_w = jnp.sqrt(cov) * sums.linear
        step = sigma * y_w
        params = unravel((flat.astype(jnp.float32) + step).astype(flat.dtype))
        path_sigma = (1 - k.c_sigma) * path_sigma + math.sqrt(k.c_sigma * (2 - k.c_sigma) * k.mu_eff) * sums.linear
        norm = jnp.linalg.norm(path_sigma)
        sigma = sigma * jnp.exp(k.c_sigma / k.d_sigma * (norm / k.chi_n - 1))
        generations = (state.generation + 1).astype(jnp.float32)
        stall = norm / jnp.sqrt(1 - (1 - k.c_sigma) ** (2 * generations)) >= (1.4 + 2 / (flat.shape[0] + 1)) * k.chi_n
        h_sigma = jnp.where(stall, 0.0, 1.0)
        path_cov = (1 - k.c_c) * path_cov + h_sigma * math.sqrt(k.c_c * (2 - k.c_c) * k.mu_eff) * y_w
        delta_h = (1 - h_sigma) * k.c_c * (2 - k.c_c)
        decay = 1 + k.c_1 * delta_h - k.c_1 - k.c_mu * jnp.sum(coefficients.square)
        cov = decay * cov + k.c_1 * path_cov**2 + k.c_mu * cov * sums.square
        return params, SepCMAESState(sigma, cov, path_sigma, path_cov), {"grad_norm": y_w, "update_norm": step}
