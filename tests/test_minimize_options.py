"""es.minimize's options: bounds, constraints, integer variables and noise (issue 44).

Every guarantee on every kind of objective (a Python callable, a JAX function, an es.HostFitness), with
restarts and in float64: fun is never called outside the box, never sees a non-integral integer variable;
result.x is in the box, integral, the best feasible point (the result saying whether one was found and the
largest violation there), and with noise the point with the best estimate. Then every refusal. The tests
share one objective per kind and dimension 4 (popsize 8), so their programs compile once."""

import dataclasses
import importlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
from test_validation import raises

import es
from es.blackbox import bounds as bounds_layer
from es.blackbox import constraints as constraints_layer
from es.blackbox import integers
from es.blackbox import uncertainty
from es.strategies import margin

DIM = 4
LOWER, UPPER = np.array([-1.0, -1.0, 0.5, -np.inf]), np.array([1.0, 0.25, 3.0, np.inf])
OPTIMUM = np.full(DIM, 2.0)  # outside the box on the first two coordinates
X0 = np.array([0.0, 0.0, 1.0, 0.0])


def sphere(x):
    return float(np.sum((np.asarray(x) - OPTIMUM) ** 2))


def jax_sphere(x):
    return jnp.sum((x - OPTIMUM) ** 2)


class Recorder:
    """A Python objective that keeps every point it is called with (and checks it is float64)."""

    def __init__(self, fun=sphere):
        self.fun, self.points, self.values = fun, [], []

    def __call__(self, x):
        assert isinstance(x, np.ndarray) and x.dtype == np.float64 and x.shape == (DIM,)
        self.points.append(np.array(x))
        self.values.append(self.fun(x))
        return self.values[-1]

    @property
    def seen(self) -> np.ndarray:
        return np.array(self.points)


def in_box(points):
    return np.all((points >= LOWER) & (points <= UPPER))


# --------------------------------------------------------------------------- bounds


@pytest.mark.parametrize("box", [(LOWER, UPPER), bounds_layer.Box(LOWER, UPPER, "transform")],
                         ids=["penalty", "transform"])
@pytest.mark.slow
def test_bounds_a_python_objective_is_only_called_inside_the_box_across_restarts(box):
    recorder = Recorder()
    result = es.minimize(recorder, X0, 1.0, max_evals=1500, bounds=box, restarts="ipop")
    assert len(recorder.points) == result.nfev > 0 and in_box(recorder.seen)
    assert in_box(result.x) and result.x.dtype == np.float64
    np.testing.assert_allclose(result.x, [1.0, 0.25, 2.0, 2.0], atol=1e-3)  # the box's closest point
    assert result.fun == sphere(result.x) and result.feasible and result.violation == 0.0
    assert len(result.restarts) >= 2


@pytest.mark.slow
def test_all_four_options_with_a_jax_objective_and_jax_constraints():
    seen = []

    def recorded(x):
        jax.debug.callback(lambda value: seen.append(np.asarray(value)), x)
        return jax_sphere(x)

    result = es.minimize(recorded, X0, 1.0, max_evals=2400, bounds=scipy.optimize.Bounds(LOWER, UPPER),
                         integer_variables=[2], constraints=lambda x: x[:1] - 0.5, noisy=True, restarts="ipop")
    jax.effects_barrier()
    assert len(result.restarts) >= 2  # a second popsize: another program, the same guarantees
    seen = np.array(seen)
    assert len(seen) == result.nfev and seen.dtype == np.float64 and in_box(seen)
    assert np.all(seen[:, 2] == np.round(seen[:, 2]))
    assert in_box(result.x) and result.feasible and result.x[0] <= 0.5 and result.x[2] == 2.0
    np.testing.assert_allclose(result.x, [0.5, 0.25, 2.0, 2.0], atol=1e-2)
    assert result.fun == pytest.approx(sphere(result.x))  # a JAX function is noise-free: its mean is its value


def test_a_sigma0_wider_than_the_box_warns_naming_the_coordinate_and_a_scale_where_no_covariance_limits_it():
    with pytest.warns(UserWarning, match=r"sigma0=2.0\): larger than the box's width 1.25 at flat index 1 "
                                         r"\(1 coordinate\(s\)\).*sigma0=0.312"):
        with pytest.raises(ValueError, match="max_evals=1"):  # warned before the checks, before any compile
            es.minimize(sphere, X0, 2.0, strategy=es.SNES(popsize=8), max_evals=1, bounds=(LOWER, UPPER))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # CMA-ES starts with its standard deviations limited instead
        es.minimize(sphere, X0, 2.0, max_evals=16, bounds=(LOWER, UPPER))


@pytest.mark.parametrize("strategy", [es.CMAES(popsize=8), es.SepCMAES(popsize=8)], ids=["CMAES", "SepCMAES"])
def test_standard_deviations_wider_than_a_third_of_the_box_are_limited_as_pycmas(strategy):
    """pycma's ``maxstd``: a third of each bounded width; ``C <- S C S``, ``p_c <- S p_c``, ``B`` and ``d`` from
    the new ``C``; a state within its limits is left as it is."""
    box = bounds_layer.Box(LOWER, UPPER)
    state = dataclasses.replace(strategy, sigma=2.0).init(jax.random.key(0), jnp.asarray(X0))
    state = state._replace(strategy_state=state.strategy_state._replace(path_cov=jnp.ones(DIM)))
    limited = bounds_layer.into_limits(box, state)
    new = limited.strategy_state
    diagonal = np.diagonal(np.asarray(new.cov)) if new.cov.ndim == 2 else np.asarray(new.cov)
    stds = float(new.sigma) * np.sqrt(diagonal)
    np.testing.assert_allclose(stds, [2 / 3, 1.25 / 3, 2.5 / 3, 2.0], rtol=1e-6)  # float32; the open one as it was
    np.testing.assert_allclose(np.asarray(new.path_cov), stds / 2.0, rtol=1e-6)
    if new.cov.ndim == 2:
        basis, scales = np.asarray(new.basis), np.asarray(new.scales)
        np.testing.assert_allclose(basis * scales**2 @ basis.T, np.asarray(new.cov), atol=1e-6)
    assert bounds_layer.into_limits(box, limited) is None
    everywhere = bounds_layer.into_limits(bounds_layer.Box(-np.ones(DIM), np.ones(DIM)), state).strategy_state
    assert float(everywhere.sigma) == pytest.approx(2 / 3) and np.allclose(everywhere.cov, np.ones(DIM) if
                                                                             new.cov.ndim == 1 else np.eye(DIM))
    cma = pytest.importorskip("cma", reason="pycma, the reference: pip install -e '.[bench]'")
    reference = cma.CMAEvolutionStrategy(X0, 2.0, {"bounds": [list(LOWER), list(UPPER)], "verbose": -9})
    np.testing.assert_allclose(stds, reference.stds, rtol=1e-4)  # pycma's start multiplies C by exp(1e-4)


@pytest.mark.parametrize("method", bounds_layer.METHODS)
def test_a_sigma0_a_hundred_times_the_box_still_finds_the_optimum_on_its_corner(method):
    """With sigma0=100 in [-1, 1]^4 every member would otherwise land on the box's faces (once 0.26 or 0.04
    after 600 evaluations): the standard deviations start at a third of the width, as pycma's."""
    box = bounds_layer.Box(-np.ones(DIM), np.ones(DIM), method)
    result = es.minimize(sphere, np.zeros(DIM), 100.0, max_evals=1000, seed=1, bounds=box)
    np.testing.assert_allclose(result.x, np.ones(DIM), atol=1e-6)
    assert result.fun == pytest.approx(DIM * 1.0, abs=1e-9)
    # the factor all coordinates share goes into sigma, so any sigma0 over the limits starts the same run (C
    # scaled by 1e-60 would underflow, and sigma / sigma0 would read as tolupsigma's growth)
    huge = es.minimize(sphere, np.zeros(DIM), 1e30, max_evals=1000, seed=1, bounds=box)
    assert (huge.x.tobytes(), huge.fun, huge.nfev) == (result.x.tobytes(), result.fun, result.nfev)


def test_the_box_map_is_pycmas_and_the_start_its_preimage():
    cma = pytest.importorskip("cma", reason="pycma, the reference: pip install -e '.[bench]'")
    rng = np.random.default_rng(1)
    box = bounds_layer.Box(LOWER, UPPER, "transform")
    x = rng.normal(size=(200, DIM)) * np.array([[3.0], [30.0], [3e3], [3e6]]).repeat(50, 0)
    reference = cma.boundary_handler.BoundTransform([list(LOWER), list(UPPER)])
    mapped = bounds_layer.transform(box, x)
    np.testing.assert_allclose(mapped, [reference.repair(row) for row in x], rtol=1e-12, atol=1e-12)
    assert in_box(mapped)
    inside = np.array([[-1.0, 0.25, 0.5, 7.0], [0.99, -0.3, 2.9, -1e9]])
    np.testing.assert_allclose(bounds_layer.transform(box, bounds_layer.inverse(box, inside)), inside, atol=1e-12)


def test_the_penalty_clips_and_its_weights_grow_while_the_mean_stays_outside():
    box = bounds_layer.Box(LOWER, UPPER)
    assert box.method == "penalty"
    x = np.array([[2.0, 0.0, 1.0, 5.0], [-3.0, 0.5, 4.0, 0.0]])
    np.testing.assert_array_equal(bounds_layer.transform(box, x), [[1.0, 0.0, 1.0, 5.0], [-1.0, 0.25, 3.0, 0.0]])
    state = bounds_layer.Penalty()
    assert np.all(bounds_layer.penalties(box, state, x) == 0)  # no weights before the mean leaves the box
    rng = np.random.default_rng(0)
    members = np.array([1.5, 0.0, 1.0, 0.0]) + 0.1 * rng.normal(size=(8, DIM))
    for _ in range(3):
        state = bounds_layer.penalty_update(box, state, rng.uniform(size=8), members, members.mean(axis=0), 2.0)
    assert state.gamma is not None and state.gamma[0] > state.gamma[1] > 0  # coordinate 0 is far outside
    np.testing.assert_allclose(bounds_layer.penalties(box, state, x), [state.gamma[0] * 1.0 / DIM,
                               (state.gamma[0] * 4.0 + state.gamma[1] * 0.0625 + state.gamma[2]) / DIM])


# --------------------------------------------------------------------------- integer variables


@pytest.mark.slow
def test_integer_variables_are_integral_whenever_fun_sees_them_and_in_the_result():
    recorder = Recorder()
    result = es.minimize(recorder, X0, 1.0, max_evals=3000, integer_variables=[0, 2],
                         bounds=(LOWER, UPPER), restarts="bipop", seed=2)
    assert len(result.restarts) >= 2
    seen = recorder.seen
    assert np.all(seen[:, [0, 2]] == np.round(seen[:, [0, 2]])) and in_box(seen)
    assert not np.any(np.signbit(seen[:, [0, 2]]) & (seen[:, [0, 2]] == 0))  # 0.0, never -0.0
    assert len(np.unique(seen[:, 2])) >= 2  # it moved on an integer coordinate
    np.testing.assert_allclose(result.x, [1.0, 0.25, 2.0, 2.0], atol=1e-3)
    assert result.x[2] == 2.0 and result.fun == sphere(result.x)


def test_integer_centering_moves_the_recombined_members_as_pycmas_method2():
    """``integers.offsets`` against pycma's own ``IntegerCentering`` (method 2, bias corrected) on the best half
    of a random population; by hand, members that all left the mean's cell for one value move to it; and the
    weights ``centered`` recombines with are the engine's, ties included."""
    cma = pytest.importorskip("cma", reason="pycma, the reference: pip install -e '.[dev]'")
    rng = np.random.default_rng(7)
    n, index = 6, [0, 2, 3, 5]
    found = integers.checked(index, n, None, None)
    mean = rng.normal(size=n) * 2
    best = mean + rng.normal(size=(6, n)) * 0.8
    centred = [np.array(row) for row in best]
    cma.integer_centering.IntegerCentering(index)(centred, mean)
    moved = integers.offsets(found, best, mean)
    np.testing.assert_allclose(moved, (np.array(centred) - best)[:, index], rtol=1e-12, atol=1e-15)
    assert np.any(moved != 0) and np.all(np.array(centred)[:, [1, 4]] == best[:, [1, 4]])

    left = np.array([[1.3], [0.7], [1.45]])  # all three leave the mean's cell (0) for 1
    np.testing.assert_array_equal(left + integers.offsets(integers.checked([0], 1, None, None), left, np.array([0.2])),
                                  1.0)

    tied = np.array([3.0, 1.0, 1.0, np.nan, 2.0, 1.0, 5.0, np.inf, 0.5, 2.0, 4.0, 3.0])
    by_rank = es.strategies.cma_es.constants(n, tied.size).weights
    np.testing.assert_allclose(integers._tied_weights(tied, np.asarray(by_rank)),
                               es.strategies.shaping.rank_weights(jnp.asarray(tied), jnp.asarray(by_rank), False),
                               atol=1e-6)  # the engine ranks in float32 here (no x64)


@pytest.mark.parametrize("kind", ["CMAES", "SepCMAES"])
def test_integer_centering_updates_as_if_the_centred_members_were_sampled(kind):
    """An update with ``integers.centered``'s ``centering`` in the state equals the update whose sums are
    rebuilt from the centred members themselves: the mean, both paths and the covariance all learn from them."""
    from es.strategies.base import Sums

    with importlib.import_module("es.blackbox.minimize").float64():
        n, popsize, index = 5, 10, [0, 3]
        found = integers.checked(index, n, None, None)
        strategy = margin.attached(getattr(es, kind)(popsize=popsize, sigma=0.7, maximize=False),
                                   integers.margin(found))
        state = strategy.init(jax.random.key(3), jnp.asarray([0.3, -1.2, 2.0, 0.45, 0.0]))
        inner = state.strategy_state
        rng = np.random.default_rng(1)
        if kind == "CMAES":  # a covariance that is not the identity, and A != 1
            q = np.linalg.qr(rng.normal(size=(n, n)))[0]
            d = np.array([0.5, 1.0, 2.0, 1.5, 0.8])
            inner = inner._replace(basis=jnp.asarray(q), scales=jnp.asarray(d),
                                   cov=jnp.asarray(q @ np.diag(d**2) @ q.T))
            to_y = q * d[None, :]
        else:
            d = np.array([0.25, 1.0, 4.0, 2.25, 0.64])
            inner = inner._replace(cov=jnp.asarray(d))
            to_y = np.diag(np.sqrt(d))
        inner = inner._replace(scaling=jnp.asarray([1.5, 1.0, 1.0, 0.7, 1.0]))
        state = state._replace(strategy_state=inner)
        mean = np.asarray(state.params)
        z = rng.normal(size=(popsize, n))
        scale = 0.7 * np.asarray(inner.scaling)
        rows = mean + scale * (z @ to_y.T)
        ranked = rng.permutation(popsize).astype(float)
        hp = strategy.hyperparameters(n)
        coefficients = strategy.coefficients(hp, inner, jnp.asarray(ranked))

        def sums(members_z):
            c = np.asarray(coefficients.linear)
            if kind == "SepCMAES":
                return Sums(jnp.asarray(c @ members_z), jnp.asarray(np.asarray(coefficients.square) @ members_z**2))
            unit = np.asarray(coefficients.outer_unit) / np.sum(members_z**2, axis=1)
            outer = np.asarray(coefficients.outer) + unit
            return Sums(jnp.asarray(c @ members_z), None, jnp.asarray((outer[:, None] * members_z).T @ members_z))

        given = integers.centered(found, strategy, state, rows, ranked).strategy_state
        assert np.any(np.asarray(given.centering.linear) != 0)
        moved = np.array(rows)
        best = np.asarray(coefficients.linear) > 0
        moved[np.ix_(best, index)] += integers.offsets(found, rows[best], mean)
        centred_z = np.linalg.solve(to_y, ((moved - mean) / scale).T).T
        generation, update = jnp.asarray(4), jax.jit(strategy.update)  # one program for both
        with_centering = update(hp, given, state.params, coefficients, sums(z), generation)
        from_members = update(hp, inner._replace(centering=margin.cleared(given.centering)), state.params,
                              coefficients, sums(centred_z), generation)
        for got, want in zip(jax.tree.leaves(with_centering), jax.tree.leaves(from_members)):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
        assert not np.any(np.asarray(with_centering.state.centering.outer))  # cleared for the next generation
        plain = getattr(es, kind)(popsize=popsize, maximize=False)
        with raises(ValueError, "no integer margin", "margin.attached"):
            integers.centered(found, plain, plain.init(jax.random.key(0), jnp.zeros(n)), rows, ranked)


@pytest.mark.slow
def test_the_margin_keeps_an_integer_coordinate_moving_where_plain_cma_es_freezes():
    """On f(x) = round(x_0)^2 + x_1^2 + ..., the rounded coordinate's value is flat around its optimum: without
    a margin its variance collapses with sigma; with one it keeps trying another value."""
    def rounded(x):
        return np.round(x[:, 0]) ** 2 + np.sum(x[:, 1:] ** 2, axis=1)

    changes = {}
    with importlib.import_module("es.blackbox.minimize").float64():
        for name, attach in (("plain", None), ("margin", margin.IntegerMargin((0,), (-np.inf,), (np.inf,)))):
            strategy = margin.attached(es.CMAES(popsize=8, sigma=0.5, maximize=False), attach)
            state = strategy.init(jax.random.key(0), jnp.full(DIM, 0.3))
            others = 0
            for generation in range(250):
                x = np.asarray(es.ask(strategy, state))
                others += generation >= 150 and np.any(np.round(x[:, 0]) != 0)
                state, _ = es.tell(strategy, state, rounded(x))
            changes[name] = others
    assert changes["plain"] == 0 and changes["margin"] >= 5, changes


# --------------------------------------------------------------------------- constraints


def linear_constraints(x):
    return np.array([x[0] + x[1] - 1.0, x[2]])


def jax_constraints(x):
    return jnp.stack([x[0] + x[1] - 1.0, x[2]])


def jax_list_constraints(x):
    """``jax_constraints`` as a list of numbers, as pycma takes ``g``'s values (and the guide writes them)."""
    return [x[0] + x[1] - 1.0, x[2]]


@pytest.mark.parametrize("g", [linear_constraints, jax_constraints, jax_list_constraints],
                         ids=["python", "jax", "jax-list"])
def test_constraints_give_the_best_feasible_point(g):
    recorder = Recorder()
    result = es.minimize(recorder, np.zeros(DIM), 0.5, max_evals=3000, constraints=g)
    assert result.feasible and result.violation == 0.0 and np.all(linear_constraints(result.x) <= 0)
    np.testing.assert_allclose(result.x, [0.5, 0.5, 0.0, 2.0], atol=1e-3)  # on the active constraints
    feasible = [p for p in recorder.points if np.all(linear_constraints(p) <= 0)]
    assert result.fun == min(sphere(p) for p in feasible) == sphere(result.x)
    assert result.ngev == result.nfev == len(recorder.points)


@pytest.mark.parametrize("python_side", ["fun", "constraints"])
def test_a_python_and_a_jax_callable_may_close_over_one_numpy_array(python_side):
    """The Python callable's probe (``objective.traced_output``) fails part-way through its trace, which in
    jax 0.10 leaves a copy of the array in the trace's precision; probed in float32, the float64 run's trace of
    the JAX callable picked that copy up and failed to compile (a raw MLIR verifier error). A new array here, so
    no earlier trace in this process has touched it."""
    shift = np.full(DIM, 2.0)
    python_fun, jax_fun = (lambda x: float(np.sum((x - shift) ** 2))), (lambda x: jnp.sum((x - shift) ** 2))
    python_g, jax_g = (lambda x: np.array([np.sum(x - shift)])), (lambda x: jnp.sum(x - shift)[None])
    fun, g = (python_fun, jax_g) if python_side == "fun" else (jax_fun, python_g)
    result = es.minimize(fun, X0, 0.5, max_evals=16, constraints=g)
    assert result.nfev == 16 and np.isfinite(result.fun) and result.feasible
    assert result.fun == pytest.approx(float(np.sum((result.x - shift) ** 2)))


def test_without_a_feasible_point_the_result_says_so_and_gives_the_least_violation():
    result = es.minimize(jax_sphere, np.zeros(DIM), 0.5, max_evals=400,
                         constraints=lambda x: jnp.stack([x[0] ** 2 + 1.0, -x[1]]))
    assert not result.feasible and not result.success
    assert result.violation == pytest.approx(result.x[0] ** 2 + 1.0) and result.violation >= 1.0


def test_a_constraint_undefined_everywhere_gives_an_evaluated_point_with_its_value_and_an_infinite_violation():
    """g NaN at every point: nothing is feasible, and every violation is infinite; the result is the evaluated
    point of the lowest f among them (not x0 with a NaN value), a NaN f (here the first three) ranking last."""
    recorder = Recorder(lambda x: np.nan if len(recorder.values) < 3 else sphere(x))
    result = es.minimize(recorder, np.ones(DIM), 0.5, max_evals=40, constraints=lambda x: np.array([np.nan]))
    assert not result.feasible and not result.success and result.violation == np.inf
    assert np.isnan(recorder.values).any() and result.fun == np.nanmin(recorder.values)
    assert any(np.array_equal(result.x, point) for point in recorder.points)


def test_a_constraint_undefined_on_part_of_the_space_leaves_those_members_out():
    """g = log(x_1) <= 0 is NaN where x_1 < 0: those members are invalid (as a NaN f is), before and after the
    Lagrangian starts, and its spreads leave them out; the run reaches the constrained optimum x_1 = 1."""
    def g(x):
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.array([np.log(x[1])])

    recorder = Recorder()
    result = es.minimize(recorder, np.array([0.0, 0.5, 1.0, 0.0]), 0.5, max_evals=3000, constraints=g)
    assert np.any(recorder.seen[:, 1] < 0)  # some members were undefined
    assert result.feasible and result.success
    np.testing.assert_allclose(result.x, [2.0, 1.0, 2.0, 2.0], atol=1e-3)
    al = constraints_layer.Lagrangian(lam=np.array([2.0]), mu=np.array([4.0]))
    undefined = np.array([[0.5], [np.nan]])
    for lagrangian in (constraints_layer.Lagrangian(), al):
        penalty = constraints_layer.penalties(lagrangian, undefined)
        assert np.isfinite(penalty[0]) and np.isnan(penalty[1])
    started = constraints_layer.started(constraints_layer.Lagrangian(), np.arange(4.0),
                                        np.array([[1.0], [2.0], [np.nan], [-1.0]]), DIM)
    assert np.all(np.isfinite(started.lam)) and np.all(np.isfinite(started.mu)) and started.mu[0] > 0


def test_the_augmented_lagrangian_penalty_is_atamnas():
    al = constraints_layer.Lagrangian(lam=np.array([2.0, 0.0]), mu=np.array([4.0, 1.0]))
    g = np.array([[0.5, -1.0], [-1.0, 3.0]])
    # member 0: 2*0.5 + 4*0.25/2, and g_2 = -1 is clipped at -lam/mu = 0; member 1: g_1 clipped at -0.5
    np.testing.assert_allclose(constraints_layer.penalties(al, g), [1.5, -2.0 ** 2 / (2 * 4.0) + 4.5])


# --------------------------------------------------------------------------- noise


def final_estimate_at(result, recorder) -> bool:
    """Whether ``result.fun`` is the mean of the last ``FINAL_EVALUATIONS`` evaluations at ``result.x``."""
    at_x = np.array(recorder.values)[np.all(recorder.seen == result.x, axis=1)]
    return at_x.size >= uncertainty.FINAL_EVALUATIONS and result.fun == pytest.approx(
        np.mean(at_x[-uncertainty.FINAL_EVALUATIONS:]))


def test_noisy_gives_the_point_with_the_best_estimate_not_the_luckiest_evaluation():
    rng = np.random.default_rng(0)

    def noisy(x):
        return float(np.sum(x**2) + rng.standard_normal())

    recorder = Recorder(noisy)
    result = es.minimize(recorder, np.full(DIM, 2.0), 1.0, max_evals=1500, noisy=True, restarts="ipop")
    values = np.array(recorder.values)
    assert final_estimate_at(result, recorder)
    assert values.min() < result.fun and np.sum(result.x**2) < 0.5
    assert result.nfev == len(recorder.points) <= 1500


def test_a_python_objectives_last_generation_leaves_the_final_evaluations_to_the_mean():
    """A Python objective's generation may stop short at the budget: it stops short of the final mean's
    evaluations too (it took them at some budgets, and result.x was then its luckiest single value)."""
    for max_evals in range(300, 308):  # every remainder of the budget by the popsize (8)
        rng = np.random.default_rng(0)
        recorder = Recorder(lambda x: float(np.sum(x**2) + rng.standard_normal()))
        result = es.minimize(recorder, np.full(DIM, 2.0), 1.0, max_evals=max_evals, noisy=True)
        assert final_estimate_at(result, recorder), max_evals
        assert result.nfev == len(recorder.points) <= max_evals


@pytest.mark.parametrize("seed", [1, 2])
def test_with_constraints_a_noisy_result_is_an_estimate_even_where_the_final_mean_is_infeasible(seed):
    """The optimum on the boundary of ``x_0 >= 1``: where a run's final mean is infeasible, the best feasible
    point is evaluated again in its place (before, result.x fell back to that point's single lucky value)."""
    rng = np.random.default_rng(seed)
    recorder = Recorder(lambda x: float(np.sum(x**2) + rng.standard_normal()))
    result = es.minimize(recorder, np.full(DIM, 2.0), 1.0, max_evals=2000, noisy=True, seed=seed,
                         constraints=lambda x: np.array([1.0 - x[0]]))
    assert result.feasible and result.x[0] >= 1.0 and final_estimate_at(result, recorder)


def test_with_restarts_a_noisy_result_is_the_best_of_the_runs_final_estimates():
    """Multiplicative noise (its runs converge, so IPOP restarts): each run's final mean is evaluated
    ``FINAL_EVALUATIONS`` times in a row, and result.x is the one whose mean is least."""
    rng = np.random.default_rng(0)
    recorder = Recorder(lambda x: float(np.sum(x**2) * (1 + 0.3 * rng.standard_normal())))
    result = es.minimize(recorder, np.full(DIM, 2.0), 1.0, max_evals=3000, noisy=True, restarts="ipop")
    assert len(result.restarts) >= 2 and final_estimate_at(result, recorder)
    points, values, count = recorder.seen, np.array(recorder.values), uncertainty.FINAL_EVALUATIONS
    finals = [values[i:i + count].mean() for i in range(len(points) - count + 1)
              if np.all(points[i:i + count] == points[i])]
    assert len(finals) >= len(result.restarts) and result.fun == pytest.approx(min(finals))


def test_a_noisy_objective_that_sometimes_fails_gives_the_mean_of_the_evaluations_that_did_not():
    rng = np.random.default_rng(0)

    def failing(x):  # a noisy simulation that fails (NaN) or marks the point infeasible (inf) now and then
        draw = rng.uniform()
        return float("nan") if draw < 0.15 else float("inf") if draw < 0.2 else float(np.sum(x**2) + rng.normal())

    recorder = Recorder(failing)
    result = es.minimize(recorder, np.full(DIM, 2.0), 1.0, max_evals=1500, noisy=True, restarts="ipop")
    values = np.array(recorder.values)
    assert np.isfinite(result.fun) and np.sum(result.x**2) < 2.0  # from 16: a fifth of the values fail
    final = values[np.all(recorder.seen == result.x, axis=1)][-uncertainty.FINAL_EVALUATIONS:]
    assert result.fun == pytest.approx(np.mean(final[np.isfinite(final)]))
    assert uncertainty.estimate([1.0, np.nan, 3.0, np.inf]) == 2.0 and uncertainty.estimate([np.nan, np.inf]) == np.inf


def test_the_noise_measure_rises_with_noise_and_falls_without():
    rng = np.random.default_rng(3)
    ordered = np.arange(20.0)
    index = uncertainty.reevaluated(ordered, rng)
    quiet = uncertainty.measured(uncertainty.Noise(), ordered, ordered[index], index)
    loud = uncertainty.measured(uncertainty.Noise(), ordered, rng.permutation(ordered)[index] * 0 + rng.uniform(
        0, 20, index.size), index)
    assert quiet.level < 0 < loud.level
    assert uncertainty.sigma_factor(loud, 10) == 1 + 2 / 20 and uncertainty.sigma_factor(quiet, 10) == 1.0


def test_the_chance_rank_change_is_numpys_hazen_percentile_of_the_rank_distances():
    rng = np.random.default_rng(4)
    for popsize in range(2, 200):
        centres = rng.integers(1, 2 * popsize, size=(2, 4))
        expected = np.percentile(np.abs(np.arange(1, 2 * popsize) - centres[..., None]), uncertainty.THETA * 50,
                                 axis=-1, method="hazen")
        np.testing.assert_array_equal(uncertainty.chance_rank_change(centres, 2 * popsize), expected)


# --------------------------------------------------------------------------- all four, on the host


@pytest.mark.slow
def test_all_four_options_with_an_host_fitness():
    def checked(params, seed):  # in a worker: a failed assertion is an es.FitnessError here
        assert np.all((params >= LOWER) & (params <= UPPER)) and params[0] == np.round(params[0])
        return float(np.sum((params - OPTIMUM) ** 2))

    with es.HostFitness(checked, num_workers=2) as fitness:
        result = es.minimize(fitness, X0, 1.0, max_evals=2400, bounds=(LOWER, UPPER), integer_variables=[0],
                             constraints=lambda x: x[:1] + x[1:2] - 1.0, noisy=True, restarts="ipop")
    assert len(result.restarts) >= 2
    assert result.feasible and in_box(result.x) and result.x[0] == np.round(result.x[0])


# --------------------------------------------------------------------------- refusals


class Growing:
    """A Python constraint function whose second call returns one value more than its first."""

    def __init__(self):
        self.calls = 0

    def __call__(self, x):
        value = float(x[0])  # a Python function: tracing it fails here
        self.calls += 1
        return np.full(2 + (self.calls > 1), value)


@pytest.mark.parametrize("kwargs, error, fragments", [
    (dict(bounds=(1.0, 2.0)), ValueError, ["x0 is outside the box", "flat index 0", "np.clip"]),
    (dict(bounds=(np.ones(DIM), -np.ones(DIM))), ValueError, ["lower must be below upper", "flat index 0"]),
    (dict(bounds=(np.nan, 1.0)), ValueError, ["lower holds NaN", "np.inf"]),
    (dict(bounds=(np.zeros(3), 1.0)), ValueError, ["lower must be a number or shaped like x0", "[4]"]),
    (dict(bounds=[-1.0]), TypeError, ["bounds must be (lower, upper)", "scipy.optimize.Bounds"]),
    (dict(bounds=[(-1.0, 1.0)] * DIM), ValueError, ["scipy.optimize.minimize's form", "zip(*pairs)"]),
    (dict(bounds=[(-1.0, 1.0), (-2.0, 2.0)], x0=np.zeros(2)), ValueError, ["one per coordinate", "(lower, upper)"]),
    (dict(bounds=bounds_layer.Box(-1.0, 1.0, "clip")), ValueError, ["method must be one of"]),
    (dict(integer_variables=[0, 4]), ValueError, ["index 4 is out of range", "0 to 3"]),
    (dict(integer_variables=[1, -3]), ValueError, ["flat index 1 is given more than once"]),
    (dict(integer_variables=[0.5]), TypeError, ["list of int indices", "0.5"]),
    (dict(integer_variables=[2], bounds=(0.2, 0.4), x0=np.full(DIM, 0.3)), ValueError,
     ["integer variable 2", "[0.2, 0.4]", "hold no integer"]),
    (dict(integer_variables=[0], strategy=es.SNES(popsize=8)), ValueError, ["integer_variables needs es.CMAES"]),
    (dict(noisy=True, strategy=es.SNES(popsize=8)), ValueError, ["noisy needs es.CMAES"]),
    (dict(noisy="yes"), TypeError, ["noisy must be True or False"]),
    (dict(constraints=3), TypeError, ["constraints must be a callable g(x)"]),
    (dict(constraints=lambda x: jnp.outer(x, x)), TypeError, ["a number or a 1-D array", "[4, 4]"]),
    (dict(constraints=lambda x: [x, -x]), TypeError, ["a number or a 1-D array", "(or a list of numbers)", "[4]"]),
    (dict(constraints=Growing()), ValueError, ["returned 3 values", "but 2 before"]),
    (dict(constraints=lambda x: "no"), TypeError, ["a number or a 1-D array", "'no'"]),
    (dict(constraints=lambda x: None), TypeError, ["a number or a 1-D array", "returned None"]),
])
def test_bad_options_are_refused_naming_the_argument_and_the_fix(kwargs, error, fragments):
    x0 = kwargs.pop("x0", np.zeros(DIM))
    with raises(error, *fragments):
        es.minimize(sphere, x0, 0.5, max_evals=200, **kwargs)
