"""Each strategy's update equals its paper's formula, computed directly (float64 numpy) on the population.

The engine never stores the population: it rebuilds sums of the noise in chunks. Here one generation is
run through ``es.ask``/``es.tell`` with known fitnesses, and the new distribution is compared with the
textbook update applied to the materialised members ``x_i`` (their noise recovered as ``(x_i - mean) /
scale``).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import optax
import scipy.stats

import es

D, P = 12, 16
MEAN = np.linspace(-1.0, 1.0, D)


def one_generation(strategy, fitness=None, seed=0):
    """``(population f64[P, D], fitness f64[P], old state, new state)`` of one ask/tell generation."""
    state = strategy.init(jax.random.key(seed), jnp.asarray(MEAN, jnp.float32))
    population = np.asarray(es.ask(strategy, state), np.float64)
    if fitness is None:
        fitness = -np.sum((population - 0.3) ** 2, axis=1)
    new, _ = es.tell(strategy, state, fitness)
    return population, np.asarray(fitness, np.float64), state, new


def centered_ranks(fitness):
    return (scipy.stats.rankdata(fitness) - 1) / (len(fitness) - 1) - 0.5


def close(actual, expected, rtol=2e-4, atol=2e-6):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


def test_openes_with_sgd_steps_along_the_rank_weighted_noise():
    lr, sigma = 0.1, 0.2
    population, fitness, state, new = one_generation(es.OpenES(popsize=P, sigma=sigma, optimizer=optax.sgd(lr)))
    eps = (population - MEAN) / sigma  # s_i * eps_i
    grad = centered_ranks(fitness) @ eps / (P * sigma)
    close(new.params, MEAN + lr * grad)


def test_snes_matches_the_natural_gradient_update_of_wierstra_et_al():
    sigma = 0.3
    population, fitness, state, new = one_generation(es.SNES(popsize=P, sigma=sigma))
    z = (population - MEAN) / sigma
    ranks = scipy.stats.rankdata(-fitness, method="ordinal")  # 1 = best (no ties here)
    raw = np.maximum(0.0, math.log(P / 2 + 1) - np.log(ranks))
    u = raw / raw.sum() - 1 / P
    eta_sigma = (3 + math.log(D)) / (5 * math.sqrt(D))
    close(new.params, MEAN + sigma * (u @ z))
    close(new.strategy_state.sigma, sigma * np.exp(eta_sigma / 2 * (u @ (z**2 - 1))))


def test_pgpe_matches_sehnkes_symmetric_gradients_with_a_plain_optimizer():
    lr, sigma, sigma_lr = 0.05, 0.3, 0.1
    strategy = es.PGPE(popsize=P, sigma=sigma, optimizer=optax.sgd(lr), sigma_learning_rate=sigma_lr)
    population, fitness, state, new = one_generation(strategy)
    f = centered_ranks(fitness)
    plus, minus = f[0::2], f[1::2]
    eps = population[0::2] - MEAN  # scaled noise of each pair's + member
    np.testing.assert_allclose(population[1::2] - MEAN, -eps, atol=1e-6)  # symmetric pairs
    n = P // 2
    grad_mean = ((plus - minus) / 2) @ eps / n
    grad_sigma = ((plus + minus) / 2 - f.mean()) @ ((eps**2 - sigma**2) / sigma) / n
    close(new.params, MEAN + lr * grad_mean)
    expected_sigma = np.clip(sigma + sigma_lr * grad_sigma, 0.8 * sigma, 1.2 * sigma)
    close(new.strategy_state.sigma, expected_sigma)


def test_ars_steps_along_the_top_directions_scaled_by_their_returns_spread():
    lr, nu, top = 0.02, 0.05, 3
    population, fitness, state, new = one_generation(es.ARS(popsize=P, sigma=nu, top_k=top, learning_rate=lr))
    delta = (population[0::2] - MEAN) / nu
    plus, minus = fitness[0::2], fitness[1::2]
    kept = np.argsort(-np.maximum(plus, minus))[:top]
    sigma_r = np.std(np.concatenate([plus[kept], minus[kept]]))
    step = lr / (top * sigma_r) * ((plus - minus)[kept] @ delta[kept])
    close(new.params, MEAN + step)


def test_sep_cma_es_matches_ros_and_hansen_with_the_cmaes_library_constants():
    sigma, n, lam = 0.4, D, P
    population, fitness, state, new = one_generation(es.SepCMAES(popsize=lam, sigma=sigma))
    # The reference: CyberAgentAILab/cmaes SepCMA.tell, one generation from C = 1, paths 0 (float64).
    mu = lam // 2
    w = np.array([math.log(mu + 1) - math.log(i + 1) for i in range(mu)])
    w /= w.sum()
    mu_eff = 1 / np.sum(w**2)
    c1 = 2 / ((n + 1.3) ** 2 + mu_eff)
    cmu_full = 2 / mu_eff / (n + math.sqrt(2)) ** 2 + (1 - 1 / mu_eff) * min(1, (2 * mu_eff - 1) / ((n + 2) ** 2 + mu_eff))
    cmu = min(1 - c1, (n + 2) / 3 * cmu_full)
    c_sigma = (mu_eff + 2) / (n + mu_eff + 3)
    d_sigma = 1 + 2 * max(0, math.sqrt((mu_eff - 1) / (n + 1)) - 1) + c_sigma
    cc = 4 / (n + 4)
    chi_n = math.sqrt(n) * (1 - 1 / (4 * n) + 1 / (21 * n**2))
    order = np.argsort(-fitness)  # best first (we maximise)
    y = (population[order] - MEAN) / sigma  # C = 1: y = z
    y_w = w @ y[:mu]
    mean = MEAN + sigma * y_w
    p_sigma = math.sqrt(c_sigma * (2 - c_sigma) * mu_eff) * y_w
    norm = np.linalg.norm(p_sigma)
    new_sigma = sigma * math.exp(c_sigma / d_sigma * (norm / chi_n - 1))
    h_sigma = 1.0 if norm / math.sqrt(1 - (1 - c_sigma) ** 2) < (1.4 + 2 / (n + 1)) * chi_n else 0.0
    p_c = h_sigma * math.sqrt(cc * (2 - cc) * mu_eff) * y_w
    delta_h = (1 - h_sigma) * cc * (2 - cc)
    cov = (1 + c1 * delta_h - c1 - cmu * w.sum()) * 1.0 + c1 * p_c**2 + cmu * (w @ y[:mu] ** 2)
    close(new.params, mean)
    close(new.strategy_state.path_sigma, p_sigma)
    close(new.strategy_state.sigma, new_sigma)
    close(new.strategy_state.path_cov, p_c)
    close(new.strategy_state.cov, cov)


@pytest.mark.slow
def test_minimising_equals_maximising_the_negated_fitness():
    for strategy in (es.SNES(popsize=P, sigma=0.3), es.ARS(popsize=P, sigma=0.05, top_k=4),
                     es.SepCMAES(popsize=P, sigma=0.3), es.PGPE(popsize=P, sigma=0.3)):
        population, fitness, _, up = one_generation(strategy)
        minimising = type(strategy)(**{**{f: getattr(strategy, f) for f in strategy.fields()}, "maximize": False})
        _, _, _, down = one_generation(minimising, fitness=-fitness)
        np.testing.assert_array_equal(np.asarray(down.params), np.asarray(up.params))


def test_snes_temperature_uses_the_weights_of_lange_et_al_favouring_the_better_half():
    sigma, t = 0.3, 30.0
    population, fitness, state, new = one_generation(es.SNES(popsize=P, sigma=sigma, temperature=t))
    z = (population - MEAN) / sigma
    ranks = scipy.stats.rankdata(-fitness, method="ordinal")  # 1 = best (no ties here)
    raw = np.exp(-20.0 / (1.0 + np.exp(-t * ((ranks - 1) / (P - 1) - 0.5))))
    u = raw / raw.sum()
    assert u[ranks <= P // 2].sum() > 0.99  # the better half carries (almost) all the weight
    eta_sigma = (3 + math.log(D)) / (5 * math.sqrt(D))
    close(new.params, MEAN + sigma * (u @ z))
    close(new.strategy_state.sigma, sigma * np.exp(eta_sigma / 2 * (u @ (z**2 - 1))))
