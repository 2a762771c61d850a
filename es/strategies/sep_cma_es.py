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

Integer variables (optional, ``es.strategies.margin``): with a ``margin`` attached, members are ``m + sigma A
sqrt(C) z`` with ``A`` the state's ``scaling``, the mean steps by ``sigma A y_w``, and the margin then moves
the mean and ``A`` of the integer coordinates (CMA-ES with margin); integer centering, where the host asks for
it, adds the state's ``centering`` to the sums first. Without one (the default) ``scaling`` and ``centering``
are ``None`` and nothing above changes, bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from es.noise import GaussianNoise, NoiseSource
from es.strategies import margin as margins
from es.strategies import shaping
from es.strategies.base import Coefficients, PerCoordinate, Step, Strategy, Sums, filled
from es.strategies import recombination
from es.strategies.recombination import expected_norm, positive_weights


class SepCMAESState(NamedTuple):
    """Sep-CMA-ES's own state (vectors float[D] in ravel order).

    Attributes:
      sigma: scalar, the global step size.
      cov: the diagonal ``C`` of the covariance.
      path_sigma: ``p_sigma``, the conjugate evolution path.
      path_cov: ``p_c``, the evolution path of ``C``.
      scaling: ``A`` of CMA-ES with margin (``es.strategies.margin``); ``None`` without a margin.
      centering: what integer centering adds to the next update's sums (``es.strategies.margin.Centering``,
        its ``outer`` the diagonal, float[D]); ``None`` without a margin.
    """

    sigma: jax.Array
    cov: PerCoordinate[jax.Array]
    path_sigma: PerCoordinate[jax.Array]
    path_cov: PerCoordinate[jax.Array]
    scaling: PerCoordinate[jax.Array] | None = None
    centering: PerCoordinate[margins.Centering] | None = None


class SepCMAESHyperparameters(NamedTuple):
    """The traced hyperparameters: the initial step size."""

    sigma: float


class Constants(NamedTuple):
    """The learning rates and normalisers of sep-CMA-ES for ``n`` parameters and ``lambda`` members."""

    weights: tuple[float, ...]
    mu_eff: float
    c_sigma: float
    d_sigma: float
    c_c: float
    c_1: float
    c_mu: float
    chi_n: float


@functools.cache
def constants(dim: int, popsize: int) -> Constants:
    n = dim
    weights, mu_eff = positive_weights(popsize)
    c_1 = 2.0 / ((n + 1.3) ** 2 + mu_eff)
    c_mu_full = 2.0 / mu_eff / (n + math.sqrt(2)) ** 2 + (1 - 1 / mu_eff) * min(
        1.0, (2 * mu_eff - 1) / ((n + 2) ** 2 + mu_eff)
    )
    c_sigma = (mu_eff + 2) / (n + mu_eff + 3)
    return Constants(
        weights=weights,
        mu_eff=mu_eff,
        c_sigma=c_sigma,
        d_sigma=1 + 2 * max(0.0, math.sqrt((mu_eff - 1) / (n + 1)) - 1) + c_sigma,
        c_c=4.0 / (n + 4),
        c_1=c_1,
        c_mu=min(1 - c_1, (n + 2) / 3 * c_mu_full),
        chi_n=expected_norm(n),
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

    ``margin`` (not an argument: ``es.strategies.margin.attached(strategy, margin)``) keeps integer variables
    moving (CMA-ES with margin); ``None`` by default.
    """

    popsize: int
    sigma: float = 0.1
    antithetic: bool = False
    maximize: bool = True
    noise: NoiseSource = GaussianNoise()
    margin: margins.IntegerMargin | None = dataclasses.field(default=None, init=False, repr=False, metadata={
        "why": "integer variables (es.minimize(integer_variables=...)): attached, not configured"})

    def __post_init__(self):
        self.check_common()
        recombination.check_popsize(self)
        self.check_noise_fits()

    def hyperparameters(self, dim: int) -> SepCMAESHyperparameters:
        return SepCMAESHyperparameters(self.sigma)

    # ---------------------------------------------------------------- the maths

    def initial_state(self, hp: SepCMAESHyperparameters, mean: jax.Array) -> SepCMAESState:
        zeros = filled(mean.shape, 0, mean.dtype)
        return SepCMAESState(filled((), hp.sigma, mean.dtype), filled(mean.shape, 1, mean.dtype), zeros, zeros,
                             margins.initial_scaling(self.margin, mean),
                             margins.initial_centering(self.margin, mean, full=False))

    def scale(self, hp, state: SepCMAESState, generation: jax.Array) -> jax.Array:
        return margins.scaled(state.scaling, state.sigma * jnp.sqrt(state.cov))

    def coefficients(self, hp, state: SepCMAESState, fitness: jax.Array) -> Coefficients:
        weights = constants(state.cov.shape[0], self.popsize).weights
        weights = shaping.rank_weights(fitness, jnp.asarray(weights, state.cov.dtype), self.maximize)
        return Coefficients(linear=weights, square=weights)

    def update(self, hp, state: SepCMAESState, mean: jax.Array, coefficients: Coefficients, sums: Sums,
               generation: jax.Array) -> Step:
        sigma, cov, path_sigma, path_cov, scaling, centering = state
        n = mean.shape[0]
        k = constants(n, self.popsize)
        if centering is not None:  # integer centering's change of the members (es.strategies.margin)
            sums = margins.centered_sums(centering, sums, 1 / jnp.sqrt(cov))
        y_w = jnp.sqrt(cov) * sums.linear
        step = margins.scaled(scaling, sigma * y_w)
        path_sigma = (1 - k.c_sigma) * path_sigma + math.sqrt(k.c_sigma * (2 - k.c_sigma) * k.mu_eff) * sums.linear
        norm = jnp.linalg.norm(path_sigma)
        sigma = sigma * jnp.exp(k.c_sigma / k.d_sigma * (norm / k.chi_n - 1))
        generations = (generation + 1).astype(mean.dtype)
        stall = norm / jnp.sqrt(1 - (1 - k.c_sigma) ** (2 * generations)) >= (1.4 + 2 / (n + 1)) * k.chi_n
        h_sigma = jnp.where(stall, 0.0, 1.0)
        path_cov = (1 - k.c_c) * path_cov + h_sigma * math.sqrt(k.c_c * (2 - k.c_c) * k.mu_eff) * y_w
        delta_h = (1 - h_sigma) * k.c_c * (2 - k.c_c)
        decay = 1 + k.c_1 * delta_h - k.c_1 - k.c_mu * jnp.sum(coefficients.square)
        cov = decay * cov + k.c_1 * path_cov**2 + k.c_mu * cov * sums.square
        if self.margin is None:
            return Step(mean + step, SepCMAESState(sigma, cov, path_sigma, path_cov), y_w, step)
        new_mean, scaling = margins.correct(self.margin, mean + step, sigma * jnp.sqrt(cov), scaling, self.popsize)
        state = SepCMAESState(sigma, cov, path_sigma, path_cov, scaling, margins.cleared(centering))
        return Step(new_mean, state, y_w, new_mean - mean)

    def stop_conditions(self, hp, state: SepCMAESState, mean, generation, criteria) -> dict[str, jax.Array]:
        std = jnp.sqrt(state.cov)
        sigma = margins.scaled(state.scaling, state.sigma)  # sigma A with a margin
        return {
            "tolx": jnp.all(sigma * jnp.maximum(jnp.abs(state.path_cov), std) < criteria.tolx),
            "tolupsigma": state.sigma / hp.sigma > criteria.tolupsigma * jnp.max(std),
            # with a margin, C's spread is the integer coordinates' variance moved into A: no condition to judge
            "conditioncov": (jnp.max(state.cov) > criteria.conditioncov * jnp.min(state.cov)) if self.margin is None
            else jnp.zeros((), bool),
            "noeffectcoord": jnp.any(mean + 0.2 * sigma * std == mean),
        }
