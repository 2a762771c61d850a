"""es.CMAES: the tutorial's equations in float64, the engine's guarantees (device counts, ask/tell, resume),
full-precision fitness through ask/tell, stopping in words, and the refusals."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import programs_built
from test_validation import raises

import es
from es.strategies.cma_es import MAX_DIM, constants

OFFSET = 79.48  # bbob's f1 offset: below float32's resolution there the ranks used to tie


def tutorial_generation(mean, sigma, cov, p_sigma, p_c, generation, x, f):
    """One generation of Hansen's tutorial (arXiv:1604.00772, with its negative weights), float64, from the
    members ``x``: the weights from eq. 49-53, written out here, not taken from es."""
    n, lam = x.shape[1], x.shape[0]
    k = constants(n, lam)
    raw = np.log((lam + 1) / 2) - np.log(np.arange(1, lam + 1))
    positive = np.where(raw > 0, raw, 0) / raw[raw > 0].sum()
    mu_eff = 1 / np.sum(positive**2)
    mu_eff_minus = raw[raw < 0].sum() ** 2 / np.sum(raw[raw < 0] ** 2)
    c_1 = 2 / ((n + 1.3) ** 2 + mu_eff)
    c_mu = min(1 - c_1, 2 * (mu_eff - 2 + 1 / mu_eff) / ((n + 2) ** 2 + mu_eff))
    alpha = min(1 + c_1 / c_mu, 1 + 2 * mu_eff_minus / (mu_eff + 2), (1 - c_1 - c_mu) / (n * c_mu))
    w = positive + np.where(raw < 0, alpha * raw / -raw[raw < 0].sum(), 0)
    np.testing.assert_allclose(k.weights, w, rtol=1e-14)
    assert (k.mu_eff, k.c_1, k.c_mu) == pytest.approx((mu_eff, c_1, c_mu), rel=1e-14)
    order = np.argsort(f)  # minimising: best first
    y = (x - mean) / sigma
    y_w = positive @ y[order]
    values, vectors = np.linalg.eigh(cov)
    inv_sqrt = vectors @ np.diag(values ** -0.5) @ vectors.T
    w_circ = np.array([wi if wi >= 0 else wi * n / np.sum((inv_sqrt @ yi) ** 2) for wi, yi in zip(w, y[order])])
    p_sigma = (1 - k.c_sigma) * p_sigma + math.sqrt(k.c_sigma * (2 - k.c_sigma) * k.mu_eff) * inv_sqrt @ y_w
    norm = np.linalg.norm(p_sigma)
    h = 1.0 if norm / math.sqrt(1 - (1 - k.c_sigma) ** (2 * (generation + 1))) < (1.4 + 2 / (n + 1)) * k.chi_n else 0.0
    p_c = (1 - k.c_c) * p_c + h * math.sqrt(k.c_c * (2 - k.c_c) * k.mu_eff) * y_w
    rank_mu = sum(wi * np.outer(yi, yi) for wi, yi in zip(w_circ, y[order]))
    cov = ((1 + k.c_1 * (1 - h) * k.c_c * (2 - k.c_c) - k.c_1 - k.c_mu * w.sum()) * cov
           + k.c_1 * np.outer(p_c, p_c) + k.c_mu * rank_mu)
    new_sigma = sigma * math.exp(k.c_sigma / k.d_sigma * (norm / k.chi_n - 1))
    return mean + sigma * y_w, new_sigma, cov, p_sigma, p_c


@pytest.mark.slow
def test_cmaes_follows_the_tutorials_equations_in_float64():
    n, lam = 6, 8
    rotation, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(n, n)))
    scales = 10.0 ** np.linspace(0, 2, n)

    def f(x):
        return float(np.sum((scales * (rotation @ (x - 0.5))) ** 2))

    with jax.enable_x64(True):
        strategy = es.CMAES(popsize=lam, sigma=0.7, maximize=False)
        state = strategy.init(jax.random.key(3), jnp.zeros(n))
        mean, sigma, cov = np.zeros(n), 0.7, np.eye(n)
        p_sigma, p_c = np.zeros(n), np.zeros(n)
        for generation in range(3):  # the second and third sample from an eigendecomposed C
            x = np.asarray(es.ask(strategy, state), np.float64)
            fitness = np.array([f(xi) for xi in x])
            state, _ = es.tell(strategy, state, fitness)
            mean, sigma, cov, p_sigma, p_c = tutorial_generation(mean, sigma, cov, p_sigma, p_c, generation, x, fitness)
            got = state.strategy_state
            np.testing.assert_allclose(np.asarray(state.params), mean, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(float(got.sigma), sigma, rtol=1e-12)
            np.testing.assert_allclose(np.asarray(got.path_sigma), p_sigma, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(np.asarray(got.path_cov), p_c, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(np.asarray(got.cov), cov, rtol=1e-10, atol=1e-12)
        # members are m + sigma B D z: their covariance is sigma^2 C (B, D from the eigendecomposition of C)
        b, d = np.asarray(got.basis), np.asarray(got.scales)
        np.testing.assert_allclose((b * d**2) @ b.T, cov, rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_cmaes_ask_tell_gives_evolves_params_bit_for_bit():
    strategy = es.CMAES(popsize=8, sigma=0.5, maximize=False)
    start = strategy.init(jax.random.key(1), jnp.ones(5))
    state = start
    for _ in range(4):
        members = np.asarray(es.ask(strategy, state))
        state, _ = es.tell(strategy, state, np.sum(members**2, axis=1).astype(np.float32))
    evolved, _ = es.evolve(strategy, lambda x, key: jnp.sum(x**2), start, 4)
    chex.assert_trees_all_equal(state.params, evolved.params)
    chex.assert_trees_all_equal(state.strategy_state, evolved.strategy_state)


@pytest.mark.slow
def test_cmaes_resumes_from_a_checkpoint_bit_for_bit(tmp_path):
    strategy = es.CMAES(popsize=8, sigma=0.5, maximize=False)
    start = strategy.init(jax.random.key(2), jnp.ones(5))

    def sphere(x, key):
        return jnp.sum(x**2)

    es.run(strategy, sphere, start, 4, run_dir=tmp_path, segment=2, progress=False)
    resumed = es.run(strategy, sphere, start, 8, run_dir=tmp_path, segment=2, resume=True, progress=False)
    straight, _ = es.evolve(strategy, sphere, start, 8)
    chex.assert_trees_all_equal(resumed.state, straight)


@pytest.mark.parametrize("make", [lambda: es.CMAES(popsize=10, sigma=0.5, maximize=False),
                                  lambda: es.SepCMAES(popsize=10, sigma=0.5, maximize=False)],
                         ids=["CMAES", "SepCMAES"])
def test_ask_tell_keeps_float64_fitness_precision_on_a_sphere_with_an_offset(make):
    """f(x) = |x|^2 + 79.48 in float64, float32 params: the ranks see differences far below float32's
    resolution at 79.48 (about 8e-6), so the search goes on to f - f_opt <= 1e-10."""
    strategy = make()
    state = strategy.init(jax.random.key(0), jnp.ones(10))
    for _ in range(400):
        members = np.asarray(es.ask(strategy, state), np.float64)
        state, metrics = es.tell(strategy, state, np.sum(members**2, axis=1) + OFFSET)
    mean = np.asarray(state.params, np.float64)
    assert float(np.sum(mean**2)) <= 1e-10
    assert float(metrics["fitness_min"]) == pytest.approx(OFFSET, abs=1e-5)  # the user's values, unshifted


@pytest.mark.slow
def test_cmaes_says_why_it_should_stop_and_keeps_running():
    with jax.enable_x64(True):
        strategy = es.CMAES(popsize=10, sigma=0.5, maximize=False)
        state = strategy.init(jax.random.key(0), jnp.ones(4))
        state, metrics = es.evolve(strategy, lambda x, key: jnp.sum(x**2), state, 400, stop_criteria=es.StopCriteria())
        stops = np.asarray(metrics["stop"])
        assert stops[0] == 0 and stops[-1] != 0
        reasons = es.stop_reasons(strategy, state)
        assert reasons and all(":" in reason for reason in reasons)
        assert any(r.startswith(("tolfun", "tolx", "noeffect")) for r in reasons), reasons
        assert set(es.stopping.reasons(int(stops[-1]), 4, 10)) == set(reasons)
        later, _ = es.evolve(strategy, lambda x, key: jnp.sum(x**2), state, 2)  # a stopped state runs on
        assert int(later.generation) == 402


@pytest.mark.slow
def test_stop_reasons_compile_once_for_the_state_from_init_and_the_states_tell_returns():
    strategy = es.CMAES(popsize=6, sigma=0.5, maximize=False)
    state = strategy.init(jax.random.key(0), jnp.ones(3))
    reasons = []
    with programs_built() as built:
        for _ in range(3):  # init's arrays are uncommitted, tell's are placed on the mesh
            reasons.append(es.stop_reasons(strategy, state))
            members = np.asarray(es.ask(strategy, state), np.float64)
            state, _ = es.tell(strategy, state, np.sum(members**2, axis=1))
    assert reasons == [[], [], []]
    assert sum("stop_mask" in name for name in built) == 1, built


def test_cmaes_refuses_more_parameters_than_it_serves_naming_the_alternatives():
    with raises(ValueError, f"{MAX_DIM + 1} parameters", "es.SepCMAES", "es.SNES"):
        es.CMAES(popsize=8).init(jax.random.key(0), jnp.zeros(MAX_DIM + 1))


def test_a_state_made_for_another_popsize_is_refused():
    state = es.SepCMAES(popsize=10).init(jax.random.key(0), jnp.zeros(4))
    with raises(ValueError, "SepCMAES(popsize=12)", "popsize"):
        es.ask(es.SepCMAES(popsize=12), state)
    with raises(ValueError, "CMAES(popsize=12)", "popsize"):
        es.tell(es.CMAES(popsize=12), es.CMAES(popsize=10).init(jax.random.key(0), jnp.zeros(4)), np.zeros(12))


def test_a_fitness_beyond_float32s_range_is_refused_not_turned_into_inf():
    strategy = es.CMAES(popsize=8, maximize=False)
    state = strategy.init(jax.random.key(0), jnp.zeros(4))
    with raises(ValueError, "es.tell", "fitness[3] = 1e+300", "float32"):
        es.tell(strategy, state, np.array([1.0, 2.0, 3.0, 1e300, 4.0, 5.0, 6.0, 7.0]))
    with jax.enable_x64(True):  # float64 holds it
        strategy.init(jax.random.key(0), jnp.zeros(4))
        es.tell(strategy, strategy.init(jax.random.key(0), jnp.zeros(4)),
                np.array([1.0, 2.0, 3.0, 1e300, 4.0, 5.0, 6.0, 7.0]))


def test_stagnation_follows_pycma_it_waits_for_100_sparse_entries_then_reports_a_search_that_no_longer_improves():
    """A fitness of pure noise: nothing improves, yet pycma's test (every 5th generation's best and median,
    at least 100 of them) cannot fire before generation 505; it fires soon after and stays."""
    strategy = es.SepCMAES(popsize=8, sigma=0.5, maximize=False)
    state = strategy.init(jax.random.key(0), jnp.zeros(2))
    state, metrics = es.evolve(strategy, lambda x, key: jax.random.normal(key), state, 700,
                               stop_criteria=es.StopCriteria())
    bit = 1 << es.stopping.CRITERIA.index("stagnation")
    stagnated = np.flatnonzero(np.asarray(metrics["stop"]) & bit) + 1  # generations, counted from 1
    assert stagnated.size and 505 <= stagnated[0] <= 600, stagnated[:3]
    assert any(r.startswith("stagnation:") for r in es.stop_reasons(strategy, state))


def test_stopping_valid_median_is_numpys_median_of_the_valid_entries():
    """Each row a case: odd and even counts (the mean of the two middle values), one valid entry, none (NaN),
    and invalid entries ignored wherever they sit."""
    values = np.random.default_rng(0).normal(size=(5, 9)).astype(np.float32)
    valid = np.ones((5, 9), bool)
    valid[1, [0, 4]] = False  # 7 valid: odd
    valid[2, 3] = False  # 8 valid: even
    valid[3] = np.arange(9) == 6  # 1 valid
    valid[4] = False  # none
    got = np.asarray(jax.jit(jax.vmap(es.stopping.valid_median))(values, valid))
    expected = [np.median(v[m]) if m.any() else np.nan for v, m in zip(values, valid)]
    np.testing.assert_array_equal(got, np.asarray(expected, np.float32))


def test_stagnation_window_medians_are_numpys_medians_of_the_two_windows():
    """The newest ``l`` sparse entries and the ``l`` before them, for odd and even ``l``, with ties."""
    rng = np.random.default_rng(1)
    history = es.stopping.initial_history(5, 10, np.float32)
    n = es.stopping.MAX_SPARSE
    best, median = rng.normal(size=n).astype(np.float32), rng.integers(0, 5, size=n).astype(np.float32)
    history = history._replace(sparse_best=jnp.asarray(best), sparse_median=jnp.asarray(median))
    windows = jax.jit(es.stopping.window_medians)
    for length in (11, 12, 400, n // 2):
        got = [float(m) for m in windows(history, jnp.int32(length))]
        newest, before = slice(0, length), slice(length, 2 * length)
        expected = [np.median(best[newest]), np.median(best[before]), np.median(median[newest]),
                    np.median(median[before])]
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(expected, np.float32))
