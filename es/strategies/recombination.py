"""What the CMA-ES family shares: recombination weights and the expected length of a standard normal vector
(Hansen, "The CMA evolution strategy: a tutorial", arXiv:1604.00772, Table 1)."""

from __future__ import annotations

import functools
import math


@functools.cache
def positive_weights(popsize: int) -> tuple[tuple[float, ...], float]:
    """``(w, mu_eff)``: ``w_k = ln(mu + 1/2... )`` normalised to sum 1 on the best ``mu = popsize // 2`` ranks
    and 0 on the rest (``k = 1`` the best), and the variance effective selection mass ``1 / sum w_k^2``.

    ``w'_k = ln(mu + 1) - ln k`` as in sep-CMA-ES's reference implementations.
    """
    mu = popsize // 2
    raw = [math.log(mu + 1) - math.log(k) for k in range(1, mu + 1)]
    weights = [w / sum(raw) for w in raw]
    return tuple(weights + [0.0] * (popsize - mu)), 1.0 / sum(w * w for w in weights)


@functools.cache
def tutorial_weights(popsize: int) -> tuple[tuple[float, ...], tuple[float, ...], float, float]:
    """The tutorial's raw weights ``w'_k = ln((popsize + 1) / 2) - ln k`` for ranks ``k = 1..popsize`` (eq. 49):
    ``(positive, negative, mu_eff, mu_eff_minus)``, the positive ones normalised to sum 1 (0 past the best
    ``mu = popsize // 2``), the negative ones as they are (0 on the best ``mu``; the strategy scales them),
    and the variance effective selection masses of each."""
    raw = [math.log((popsize + 1) / 2) - math.log(k) for k in range(1, popsize + 1)]
    plus = sum(w for w in raw if w > 0)
    positive = tuple(w / plus if w > 0 else 0.0 for w in raw)
    negative = tuple(w if w < 0 else 0.0 for w in raw)
    minus = sum(negative)
    mu_eff_minus = minus * minus / sum(w * w for w in negative) if minus else 0.0
    return positive, negative, 1.0 / sum(w * w for w in positive), mu_eff_minus


def expected_norm(n: int) -> float:
    """``E||N(0, I_n)||``, approximated as ``sqrt(n) (1 - 1/(4n) + 1/(21 n^2))``."""
    return math.sqrt(n) * (1 - 1 / (4 * n) + 1 / (21 * n * n))


def check_popsize(strategy) -> None:
    """Refuse fewer than 4 members: the best half recombine, and the weights need two of them."""
    if strategy.popsize < 4:
        raise ValueError(
            f"{type(strategy).__name__}(popsize={strategy.popsize}): popsize must be at least 4 (the best half "
            "recombine, and the weights need two members); use popsize=4 or more."
        )
