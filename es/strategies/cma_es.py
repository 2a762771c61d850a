"""CMA-ES with a full covariance matrix (Hansen, "The CMA evolution strategy: a tutorial", arXiv:1604.00772,
2016): its default weights (positive and negative, "active" CMA), cumulative step-size adaptation (CSA),
rank-one and rank-mu updates.

The distribution is ``N(m, sigma^2 C)`` with ``C = B diag(d)^2 B^T``. Member ``i`` is ``m + sigma B D z_i``
with ``z_i ~ N(0, I)`` rebuilt from the shared keys (the strategy's ``scale`` is the matrix ``sigma B D``).
The member of rank ``k`` gets the weight ``w_k``: the tutorial's ``ln((lambda + 1) / 2) - ln k``, positive
on the best ``mu = lambda // 2`` (normalised to sum 1) and negative on the worst (eq. 53: scaled to sum
``-min(alpha_mu, alpha_mu_eff, alpha_posdef)``); tied members share the mean of their ranks' weights. With
``w+`` the positive weights and ``w°_i = w_i`` (``w_i >= 0``) or ``n w_i / |z_i|^2`` (``w_i < 0``, as
``|C^-1/2 y_i| = |z_i|``), ``Sums.linear = sum_i w+_i z_i`` and ``Sums.outer = sum_i w°_i z_i z_i^T``
(``Coefficients.outer_unit``; never a stored population)::

    y_w     = B D Sums.linear                                                   = sum_i w+_i y_i
    m       <- m + sigma y_w
    p_sigma <- (1 - c_sigma) p_sigma + sqrt(c_sigma (2 - c_sigma) mu_eff) B Sums.linear     (C^-1/2 y_w)
    sigma   <- sigma exp(c_sigma / d_sigma (|p_sigma| / E|N(0, I)| - 1))
    p_c     <- (1 - c_c) p_c + h_sigma sqrt(c_c (2 - c_c) mu_eff) y_w
    C       <- (1 + c_1 dh - c_1 - c_mu sum_i w_i) C + c_1 p_c p_c^T + c_mu (B D) Sums.outer (B D)^T
    B, d    <- the eigendecomposition of C, every ``eigen_interval`` generations

with ``h_sigma = 1`` unless ``|p_sigma| / sqrt(1 - (1 - c_sigma)^(2 (g + 1))) >= (1.4 + 2 / (n + 1))
E|N(0, I)|``, ``dh = (1 - h_sigma) c_c (2 - c_c)``, and the tutorial's defaults (its Table 1):
``c_sigma = (mu_eff + 2) / (n + mu_eff + 5)``, ``d_sigma = 1 + 2 max(0, sqrt((mu_eff - 1) / (n + 1)) - 1) +
c_sigma``, ``c_c = (4 + mu_eff / n) / (n + 4 + 2 mu_eff / n)``, ``c_1 = 2 / ((n + 1.3)^2 + mu_eff)``,
``c_mu = min(1 - c_1, 2 (mu_eff - 2 + 1 / mu_eff) / ((n + 2)^2 + mu_eff))``; ``alpha_mu = 1 + c_1 / c_mu``,
``alpha_mu_eff = 1 + 2 mu_eff- / (mu_eff + 2)``, ``alpha_posdef = (1 - c_1 - c_mu) / (n c_mu)``.

The eigendecomposition is deferred as the tutorial suggests: it runs every ``max(1, floor(1 / (10 n (c_1 +
c_mu))))`` generations (every generation below about 30 parameters), so a generation costs ``O(n^2 lambda)``
besides it. ``MAX_DIM`` parameters at most: above, use ``es.SepCMAES`` or ``es.SNES`` (linear in ``n``).

Integer variables (optional, ``es.strategies.margin``): with a ``margin`` attached, members are ``m + sigma A
B D z`` with ``A`` the state's diagonal ``scaling``, the mean steps by ``sigma A y_w`` (``C`` still learns from
``y``), and after each update the margin moves the mean and ``A`` of the integer coordinates so that each keeps
a probability of another value; integer centering, where the host asks for it, adds the state's ``centering`` to
the sums first. Without one (the default) the state's ``scaling`` and ``centering`` are ``None`` and nothing
above changes, bit for bit.

A padded program (``padding``, es.minimize's restarts): a program of ``P`` members serves a run of ``lambda <=
P``, its first ``lambda`` members, with the constants for ``lambda`` traced in ``hp.padding`` and the weights
of ranks past ``lambda`` zero, so that one compiled program serves several restarts' popsizes. The members
past ``lambda`` get no weight, whatever their fitness; the same maths, summed over ``P`` rows instead of
``lambda`` (other last bits).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from es.noise import GaussianNoise, NoiseSource
from es.strategies import margin as margins
from es.strategies import shaping
from es.strategies.base import Coefficients, Step, Strategy, Sums, filled
from es.strategies import recombination
from es.strategies.recombination import expected_norm, tutorial_weights

MAX_DIM = 4096
"""The most parameters ``CMAES`` serves: its state holds ``3 n^2`` floats and a generation costs ``O(n^2 lambda)``."""


class CMAESState(NamedTuple):
    """CMA-ES's own state.

    Attributes:
      sigma: scalar, the global step size.
      cov: float[n, n], the covariance ``C``.
      basis: float[n, n], ``B``: the eigenvectors of ``C`` (columns), as of the last decomposition.
      scales: float[n], ``d``: the square roots of the eigenvalues of ``C``, as of the last decomposition.
      path_sigma: float[n], ``p_sigma``, the conjugate evolution path.
      path_cov: float[n], ``p_c``, the evolution path of ``C``.
      scaling: float[n], ``A`` of CMA-ES with margin (``es.strategies.margin``); ``None`` without a margin.
      centering: what integer centering adds to the next update's sums (``es.strategies.margin.Centering``,
        its ``outer`` float[n, n]); ``None`` without a margin.
    """

    sigma: jax.Array
    cov: jax.Array
    basis: jax.Array
    scales: jax.Array
    path_sigma: jax.Array
    path_cov: jax.Array
    scaling: jax.Array | None = None
    centering: margins.Centering | None = None


class CMAESHyperparameters(NamedTuple):
    """The traced hyperparameters: the initial step size, and for a padded program its ``Padding``."""

    sigma: float
    padding: "Padding | None" = None


class Constants(NamedTuple):
    """The tutorial's learning rates and normalisers for ``n`` parameters and ``lambda`` members."""

    weights: tuple[float, ...]
    """``w_k`` for ranks ``k = 1..lambda``: positive on the best ``mu``, negative on the worst."""
    mu_eff: float
    c_sigma: float
    d_sigma: float
    c_c: float
    c_1: float
    c_mu: float
    chi_n: float
    eigen_interval: int
    sigma_path_rate: float
    """``sqrt(c_sigma (2 - c_sigma) mu_eff)``"""
    cov_path_rate: float
    """``sqrt(c_c (2 - c_c) mu_eff)``"""


class Padding(NamedTuple):
    """What a program of ``P`` members needs, traced, to serve a run of ``members <= P`` (``padding``).

    Attributes:
      members: int, ``lambda``: members ``0..lambda-1`` are the run's, the rest get no weight.
      constants: ``constants(n, lambda)`` as arrays, its ``weights`` float[P] (zero past ``lambda``).
    """

    members: jax.Array
    constants: Constants


def padding(n: int, members: int, popsize: int, dtype=np.float64) -> Padding:
    """The ``Padding`` of a ``popsize``-member program for a run of ``members`` on ``n`` params (numpy)."""
    if not 4 <= members <= popsize:
        raise ValueError(f"padding(members={members}, popsize={popsize}): a padded program serves runs of 4 to "
                         f"popsize members; compile one of {members} members or more.")
    k = constants(n, members)
    weights = np.zeros(popsize, dtype)
    weights[:members] = k.weights
    floats = {name: np.asarray(getattr(k, name), dtype) for name in Constants._fields
              if name not in ("weights", "eigen_interval")}
    return Padding(np.int32(members), Constants(weights=weights, eigen_interval=np.int32(k.eigen_interval), **floats))


@functools.cache
def constants(n: int, popsize: int) -> Constants:
    positive, negative, mu_eff, mu_eff_minus = tutorial_weights(popsize)
    c_sigma = (mu_eff + 2) / (n + mu_eff + 5)
    c_1 = 2 / ((n + 1.3) ** 2 + mu_eff)
    c_mu = min(1 - c_1, 2 * (mu_eff - 2 + 1 / mu_eff) / ((n + 2) ** 2 + mu_eff))
    alpha = min(1 + c_1 / c_mu, 1 + 2 * mu_eff_minus / (mu_eff + 2), (1 - c_1 - c_mu) / (n * c_mu))
    minus = -sum(negative) or 1.0
    c_c = (4 + mu_eff / n) / (n + 4 + 2 * mu_eff / n)
    return Constants(
        weights=tuple(w + alpha * v / minus for w, v in zip(positive, negative)),
        mu_eff=mu_eff,
        c_sigma=c_sigma,
        d_sigma=1 + 2 * max(0.0, math.sqrt((mu_eff - 1) / (n + 1)) - 1) + c_sigma,
        c_c=c_c,
        c_1=c_1,
        c_mu=c_mu,
        chi_n=expected_norm(n),
        eigen_interval=max(1, math.floor(1 / (10 * n * (c_1 + c_mu)))),
        sigma_path_rate=math.sqrt(c_sigma * (2 - c_sigma) * mu_eff),
        cov_path_rate=math.sqrt(c_c * (2 - c_c) * mu_eff),
    )


@dataclasses.dataclass(frozen=True)
class CMAES(Strategy):
    """CMA-ES: a global step size and a full covariance matrix, both adapted (at most ``MAX_DIM`` params).

    Args:
      popsize: ``lambda``, members per generation (>= 4; the tutorial's
        default is ``4 + floor(3 ln n)``). The best half recombine.
      sigma: the initial global step size (> 0): about a quarter of the
        width of the region where the optimum may be.
      antithetic: sample mirrored pairs (off in the tutorial).
      maximize: whether the fitness is to be maximised.
      noise: ``es.GaussianNoise()`` or ``es.NoiseTable(...)``.

    ``margin`` (not an argument: ``es.strategies.margin.attached(strategy, margin)``) keeps integer variables
    moving (CMA-ES with margin; ``es.blackbox.integers.centered`` adds integer centering); ``None`` by default.
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

    def hyperparameters(self, dim: int) -> CMAESHyperparameters:
        if dim > MAX_DIM:
            raise ValueError(
                f"CMAES(popsize={self.popsize}) on {dim} parameters: a full covariance serves at most "
                f"{MAX_DIM} (it holds 3 n^2 floats and costs O(n^2 popsize) per generation); for more use "
                "es.SepCMAES (a diagonal covariance) or es.SNES, which are linear in the parameters."
            )
        return CMAESHyperparameters(self.sigma)

    # ---------------------------------------------------------------- the maths

    def initial_state(self, hp: CMAESHyperparameters, mean: jax.Array) -> CMAESState:
        n, dtype = mean.shape[0], mean.dtype
        eye, zeros = jax.device_put(np.eye(n, dtype=dtype)), filled((n,), 0, dtype)  # put: no program compiled
        return CMAESState(filled((), hp.sigma, dtype), eye, eye, filled((n,), 1, dtype), zeros, zeros,
                          margins.initial_scaling(self.margin, mean),
                          margins.initial_centering(self.margin, mean, full=True))

    def scale(self, hp, state: CMAESState, generation: jax.Array) -> jax.Array:
        return margins.scaled(state.scaling, state.sigma * state.basis * state.scales[None, :])

    def constants(self, hp: CMAESHyperparameters, n: int) -> Constants:
        """``constants(n, popsize)``, or a padded program's traced ones."""
        return constants(n, self.popsize) if hp.padding is None else hp.padding.constants

    def coefficients(self, hp, state: CMAESState, fitness: jax.Array) -> Coefficients:
        n = state.scales.shape[0]
        weights = jnp.asarray(self.constants(hp, n).weights, state.cov.dtype)
        members = None if hp.padding is None else hp.padding.members
        weights = shaping.rank_weights(fitness, weights, self.maximize, members)
        positive = jnp.maximum(weights, 0.0)
        return Coefficients(linear=positive, outer=positive, outer_unit=n * jnp.minimum(weights, 0.0))

    def update(self, hp, state: CMAESState, mean: jax.Array, coefficients: Coefficients, sums: Sums,
               generation: jax.Array) -> Step:
        sigma, cov, basis, scales, path_sigma, path_cov, scaling, centering = state
        n = mean.shape[0]
        k = self.constants(hp, n)
        to_y = basis * scales[None, :]  # B D: z-space to y-space
        if centering is not None:  # integer centering's change of the members (es.strategies.margin)
            sums = margins.centered_sums(centering, sums, basis.T / scales[:, None])
        y_w = to_y @ sums.linear
        path_sigma = (1 - k.c_sigma) * path_sigma + k.sigma_path_rate * (basis @ sums.linear)
        norm = jnp.linalg.norm(path_sigma)
        stall = norm / jnp.sqrt(1 - (1 - k.c_sigma) ** (2 * (generation + 1).astype(mean.dtype))) >= (
            1.4 + 2 / (n + 1)) * k.chi_n
        h_sigma = jnp.where(stall, 0.0, 1.0)
        path_cov = (1 - k.c_c) * path_cov + h_sigma * k.cov_path_rate * y_w
        weight_sum = jnp.sum(coefficients.outer) + jnp.sum(coefficients.outer_unit) / n  # sum_i w_i
        decay = 1 + k.c_1 * (1 - h_sigma) * k.c_c * (2 - k.c_c) - k.c_1 - k.c_mu * weight_sum
        cov = decay * cov + k.c_1 * jnp.outer(path_cov, path_cov) + k.c_mu * to_y @ sums.outer @ to_y.T
        basis, scales = jax.lax.cond(generation % k.eigen_interval == k.eigen_interval - 1, eigen,
                                     lambda c: (basis, scales), cov)
        new_sigma = sigma * jnp.exp(k.c_sigma / k.d_sigma * (norm / k.chi_n - 1))
        if self.margin is None:
            step = sigma * y_w
            return Step(mean + step, CMAESState(new_sigma, cov, basis, scales, path_sigma, path_cov), y_w, step)
        std = new_sigma * jnp.sqrt(jnp.sum((basis * scales[None, :]) ** 2, axis=1))  # what the next members get
        new_mean, scaling = margins.correct(self.margin, mean + sigma * scaling * y_w, std, scaling, self.popsize)
        state = CMAESState(new_sigma, cov, basis, scales, path_sigma, path_cov, scaling, margins.cleared(centering))
        return Step(new_mean, state, y_w, new_mean - mean)

    def stop_conditions(self, hp, state: CMAESState, mean, generation, criteria) -> dict[str, jax.Array]:
        n = mean.shape[0]
        axis = generation % n
        sigma = margins.scaled(state.scaling, state.sigma)  # sigma A with a margin
        step_on_axis = 0.1 * sigma * state.scales[axis] * state.basis[:, axis]
        return {
            "tolx": jnp.all(sigma * jnp.maximum(jnp.abs(state.path_cov), jnp.sqrt(_diagonal(state.cov)))
                            < criteria.tolx),
            "tolupsigma": state.sigma / hp.sigma > criteria.tolupsigma * jnp.max(state.scales),
            "conditioncov": jnp.max(state.scales) ** 2 > self._condition_limit(state, criteria),
            "noeffectaxis": jnp.all(mean + step_on_axis == mean),
            "noeffectcoord": jnp.any(mean + 0.2 * sigma * jnp.sqrt(_diagonal(state.cov)) == mean),
        }

    def _condition_limit(self, state: CMAESState, criteria) -> jax.Array:
        """``conditioncov``'s bound on the largest eigenvalue of ``C``. With a margin the integer coordinates'
        variance moves from ``C`` into ``A`` (their flat plateaus shrink it in ``C``): the bound then judges the
        correlations, ``C``'s condition over that of its diagonal, as pycma's coordinate alleviation does."""
        limit = criteria.conditioncov * jnp.min(state.scales) ** 2
        if self.margin is None:
            return limit
        diagonal = _diagonal(state.cov)
        return limit * jnp.max(diagonal) / jnp.min(diagonal)


def eigen(cov: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(B, d)``: the eigenvectors and the square roots of the eigenvalues of the symmetrised ``cov`` (the
    eigenvalues floored at a tiny positive value, so that ``d`` stays real and ``B D`` invertible)."""
    values, vectors = jnp.linalg.eigh((cov + cov.T) / 2)
    return vectors, jnp.sqrt(jnp.maximum(values, eigenvalue_floor(cov.dtype)))


def eigenvalue_floor(dtype) -> float:
    """The least eigenvalue ``eigen`` keeps: ``tiny / eps`` of ``dtype`` (a Python float, for JAX and numpy)."""
    info = np.finfo(dtype)
    return float(info.tiny / info.eps)


def _diagonal(matrix: jax.Array) -> jax.Array:
    """``matrix``'s diagonal by indexing (``jnp.diag`` traced first without ``jax_enable_x64`` and then with it
    in one process mixes float32 and float64 constants in jax 0.10)."""
    index = jnp.arange(matrix.shape[0])
    return matrix[index, index]
