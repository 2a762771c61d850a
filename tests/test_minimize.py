"""es.minimize: every kind of objective, the budget never exceeded, the target, restarts (IPOP, BIPOP), the
result and its history, and clear errors before anything runs."""

import contextlib
import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import programs_built
from test_validation import raises

import es
from es import executable_cache
from es.blackbox import Schedule, objective
from es.blackbox.restarts import MAX_RESTARTS, PAD_WORK, PADDED_OCTAVES, SMALL_OCTAVES, program_popsizes
from es.blackbox.minimize import _checked as minimize_checks
from es.blackbox.minimize import float64
from es.blackbox.minimize import run_key as minimize_run_key
from es.engine import fitness_history, loop, stopping
from es.engine.generation import rank
from es.fitness import Fitnesses, from_host


def shifted_sphere(x):
    return float(np.sum((np.asarray(x) - 1.0) ** 2) + 79.48)


def test_a_python_callable_is_minimised_to_the_target_in_float64_within_the_budget():
    calls = []

    def counted(x):
        assert isinstance(x, np.ndarray) and x.dtype == np.float64 and x.shape == (6,)
        calls.append(1)
        return shifted_sphere(x)

    result = es.minimize(counted, np.zeros(6), 0.5, max_evals=4000, target=79.48 + 1e-10)
    assert result.success and result.stop.startswith("target")
    assert result.fun - 79.48 <= 1e-10 and result.fun == shifted_sphere(result.x)
    assert result.x.dtype == np.float64 and result.nfev == len(calls) <= 4000
    assert len(result.history["fun"]) == result.nit and np.all(np.diff(result.history["fun"]) <= 0)
    assert result.history["nfev"][-1] == result.nfev
    # x0 as a list of numbers is a vector, as scipy and pycma take it: fun sees the same arrays, the same run
    calls.clear()
    from_list = es.minimize(counted, [0.0] * 6, 0.5, max_evals=4000, target=79.48 + 1e-10)
    assert isinstance(from_list.x, np.ndarray) and from_list.nfev == len(calls) == result.nfev
    np.testing.assert_array_equal(from_list.x, result.x)


def test_a_python_callable_whose_probed_branch_ignores_x_is_still_a_python_callable():
    """A numpy objective that returns a constant on some calls (a failed simulation, say) traces without error
    on such a call; its value does not depend on x there, so it is evaluated as Python, never compiled."""
    calls = []

    def fails_at_first(x):
        calls.append(1)
        if len(calls) == 1:  # the probe's call: no use of x, so JAX traces it
            return float("nan")
        return shifted_sphere(x)

    assert objective.kind_of(fails_at_first, np.zeros(6)) == "python"
    assert objective.kind_of(lambda x: 1.0, np.zeros(6)) == "python"
    assert objective.kind_of(lambda x: jnp.sum(x) * 0.0, np.zeros(6)) == "jax"
    result = es.minimize(fails_at_first, np.zeros(6), 0.5, max_evals=4000, target=79.48 + 1e-10)
    assert result.success and len(calls) == result.nfev + 2  # the two probes, then one call per evaluation


def test_a_list_of_numbers_is_a_vector_for_a_jax_function_too():
    """Traced on the vector (as a list of scalars, jnp code on it failed to trace and ran as Python)."""
    kind, _, x0 = minimize_checks(lambda x: jnp.sum(x**2), (1.0, 2), 0.5, None, 100, None, None, 0)
    assert kind == "jax" and isinstance(x0, np.ndarray) and x0.dtype == np.float64 and x0.shape == (2,)


@pytest.mark.slow
def test_a_python_callables_run_compiles_its_generation_program_once_and_nothing_else():
    # The first state (from strategy.init) and the states the program returns are placed differently; a jitted
    # call would compile the program a second time for the latter. The first state, its hyperparameters and the
    # run's key are put on the device or made by one small program (jit(run_key)), never by eager jnp calls,
    # each of which compiled a program of its own (a dozen in a fresh process).
    with programs_built() as built:
        result = es.minimize(shifted_sphere, np.zeros(7), 0.5, max_evals=300)  # a popsize (9) no other test uses
    assert result.nit >= 3
    assert built == ["jit(_tell_ask_compiled)"], built  # the run's key made on the host (run_key)


@pytest.mark.parametrize("x64", [False, True])
def test_a_runs_key_made_on_the_host_is_jaxs_fold_in_of_the_seed(x64):
    seeds = [0, 1, 7, 2**31 - 1] + ([2**32 - 1, 2**32, 2**40 + 5, 2**63 - 1] if x64 else [])
    with jax.enable_x64(x64):
        for seed in seeds:
            for index in (0, 1, 9, 2**31 - 1):
                expected = jax.random.key_data(jax.random.fold_in(jax.random.key(seed), index))
                np.testing.assert_array_equal(jax.random.key_data(minimize_run_key(seed, index)), expected)


@pytest.mark.slow
def test_a_jax_function_runs_compiled_and_stops_by_itself():
    result = es.minimize(lambda x: jnp.sum((x - 1.0) ** 2), np.zeros(5), 0.5, max_evals=20_000)
    assert result.success and result.fun < 1e-12
    assert result.stop.split(":")[0] in ("tolfun", "tolfunhist", "tolx"), result.stop
    assert result.nfev < 20_000 and result.nfev % 8 == 0  # popsize 4 + floor(3 ln 5) = 8, whole generations
    np.testing.assert_allclose(result.x, np.ones(5), atol=1e-5)


def test_a_jax_function_on_one_device_builds_its_evaluation_and_generation_programs_and_nothing_else():
    """Popsize 11 (11 params) has no divisor among this session's 8 devices: the members are evaluated on one,
    put there by a transfer, where an eager ``jnp.asarray`` compiled a program per popsize."""
    with programs_built() as built:
        result = es.minimize(lambda x: jnp.sum(x**2), np.ones(11), 0.5, max_evals=33)
    assert result.nfev == 33 and result.restarts[0].popsize == 11
    assert sorted(built) == ["jit(_tell_ask_compiled)", "jit(_vmapped)"], built


@pytest.mark.slow
def test_the_budget_is_never_exceeded():
    result = es.minimize(shifted_sphere, np.zeros(4), 0.5, max_evals=101, restarts="ipop")
    assert result.nfev == 101 and result.stop.startswith("max_evals")
    jax_result = es.minimize(lambda x: jnp.sum(x**2), np.ones(4), 0.5, max_evals=101)
    assert jax_result.nfev <= 101 and jax_result.stop.startswith("max_evals")


@pytest.mark.slow
def test_a_pytree_x0_gives_a_pytree_x():
    result = es.minimize(lambda p: jnp.sum((p["a"] - 2.0) ** 2) + jnp.sum(p["b"] ** 2),
                         {"a": np.zeros(2), "b": np.ones(3)}, 0.5, max_evals=6000)
    np.testing.assert_allclose(result.x["a"], [2.0, 2.0], atol=1e-4)
    assert result.x["b"].shape == (3,) and result.x["b"].dtype == np.float64


def test_an_host_fitness_runs_in_workers():
    fitness = es.HostFitness(lambda params, seed: float(np.sum((params - 0.5) ** 2)), num_workers=2)
    result = es.minimize(fitness, np.zeros(3), 0.3, max_evals=1500, target=1e-6)
    assert result.fun <= 1e-6 and result.success
    fitness.close()


@pytest.mark.slow
def test_ipop_doubles_the_population_at_each_restart():
    def rastrigin(x):
        return float(10 * len(x) + np.sum(x**2 - 10 * np.cos(2 * np.pi * x)))

    with programs_built() as built:
        result = es.minimize(rastrigin, np.full(2, 3.0), 2.0, max_evals=20_000, restarts="ipop", target=1e-8,
                             seed=3)
    sizes = [run.popsize for run in result.restarts]
    assert sizes == [6 * 2**k for k in range(len(sizes))] and len(sizes) > 2  # 4 + floor(3 ln 2) = 6
    # A Python objective's call builds no popsize it does not run (no next large run's program ahead of time).
    assert built.count("jit(_tell_ask_compiled)") <= len(sizes), built
    assert sum(run.nfev for run in result.restarts) == result.nfev
    assert result.fun <= 1e-8 and result.success
    assert all(math.isfinite(run.fun) for run in result.restarts)  # each run's own best, improving or not
    assert min(run.fun for run in result.restarts) == result.fun == result.restarts[-1].fun


def test_a_restart_schedule_builds_few_programs_and_a_second_call_none():
    """A schedule's popsizes are lambda_0 2^k (k <= MAX_RESTARTS: 10 at most, however many runs); one padded
    program serves a group of them (``program_popsizes``: here 7 to 56, the README example's, all in one), and
    the next large run's group's is compiled ahead; a JAX function adds its vmap per popsize."""

    def rastrigin(x):
        return 10.0 * x.size + jnp.sum(x**2 - 10.0 * jnp.cos(2 * jnp.pi * x))

    with programs_built() as built:
        result = es.minimize(rastrigin, np.full(3, 3.0), 2.0, max_evals=10_000, restarts="bipop", seed=1)
    popsizes = {run.popsize for run in result.restarts}
    assert popsizes <= {7 * 2**k for k in range(10)} and len(result.restarts) > len(popsizes), result.restarts
    assert built.count("jit(_vmapped)") == len(popsizes), built
    served = program_popsizes(7, 3, loop.SMALL_WORK)
    assert {served[p] for p in popsizes} == {56} and len(popsizes) >= 3, result.restarts
    assert 1 <= built.count("jit(_tell_ask_compiled)") <= 2, built
    assert "jit(_ask_compiled)" not in built, built  # a run's first members come from its loop's one program
    with programs_built() as again:
        es.minimize(rastrigin, np.full(3, 3.0), 2.0, max_evals=10_000, restarts="bipop", seed=1)
    assert again == [], again


def test_bipop_alternates_a_large_and_a_small_regime_sharing_the_budget():
    schedule = Schedule("bipop", popsize=10, sigma=2.0, seed=0)
    runs = [schedule.next()]
    budgets = {"first": 0, "large": 0, "small": 0}
    while runs[-1] is not None and len(runs) < 1000:
        last = runs[-1]  # a large run uses 1,000 evaluations per 10 members, a small one all it may
        used = 100 * last.popsize if last.regime != "small" else last.max_generations * last.popsize
        budgets[runs[-1].regime] += used
        runs.append(schedule.next(used))
    assert runs[-1] is None  # after the 9th large restart
    runs = runs[:-1]
    large = [r for r in runs if r.regime == "large"]
    small = [r for r in runs if r.regime == "small"]
    assert runs[0].regime == "first" and [r.popsize for r in large] == [10 * 2**k for k in range(1, 10)]
    assert small and all(10 <= r.popsize <= 10 * 2**9 and 0.02 <= r.sigma <= 2.0 for r in small)
    assert {r.popsize for r in small} <= {10 * 2**k for k in range(10)}  # octaves: the programs of other runs
    assert all(r.max_generations is not None for r in small) and all(r.sigma == 2.0 for r in large)
    assert budgets["small"] + budgets["first"] >= 0.5 * budgets["large"]  # the small regime gets its share


def test_bipop_solves_a_multimodal_function_the_first_run_does_not():
    def rastrigin(x):
        return float(10 * len(x) + np.sum(x**2 - 10 * np.cos(2 * np.pi * x)))

    alone = es.minimize(rastrigin, np.full(3, 3.0), 2.0, max_evals=10_000, target=1e-8, seed=1)
    restarted = es.minimize(rastrigin, np.full(3, 3.0), 2.0, max_evals=10_000, target=1e-8, restarts="bipop", seed=1)
    assert not alone.success and restarted.success
    assert {run.regime for run in restarted.restarts} >= {"first", "large"}


@pytest.mark.parametrize("kwargs, error, fragments", [
    (dict(x0=np.array([0.0, np.nan])), ValueError, ["es.minimize(x0=...)", "finite"]),
    (dict(x0=np.zeros(0)), ValueError, ["x0 is empty"]),
    (dict(sigma0=0.0), ValueError, ["es.minimize(sigma0=0.0)", "> 0"]),
    (dict(sigma0=-1.0), ValueError, ["sigma0"]),
    (dict(max_evals=5), ValueError, ["es.minimize(max_evals=5)", "max_evals >= 8"]),
    (dict(restarts="sometimes"), ValueError, ["es.minimize(restarts='sometimes')", "'ipop'", "'bipop'"]),
    (dict(restarts="bipopp"), ValueError, ["es.minimize(restarts='bipopp')", "(did you mean 'bipop'?)"]),
    (dict(target=-math.inf), ValueError, ["es.minimize(target=-inf): target must be a finite float (e.g. 1e-8)."]),
    (dict(strategy="CMAES"), TypeError, ["es.minimize(strategy='CMAES')", "es.SepCMAES"]),
    (dict(fun=42), TypeError, ["es.minimize(fun=42)", "callable"]),
    (dict(fun=lambda x: jnp.stack([x, x])), TypeError, ["fun(x) must return one real number"]),
    (dict(fun=lambda x: "no"), TypeError, ["fun must return one real number", "'no'"]),
    (dict(strategy=es.CMAES(popsize=8), x0=np.zeros(5000)), ValueError, ["es.SepCMAES"]),
])
def test_bad_input_is_refused_naming_the_argument_and_the_fix(kwargs, error, fragments):
    arguments = {**dict(fun=shifted_sphere, x0=np.zeros(5), sigma0=0.5, max_evals=1000), **kwargs}
    fun, x0, sigma0 = arguments.pop("fun"), arguments.pop("x0"), arguments.pop("sigma0")
    with raises(error, *fragments):
        es.minimize(fun, x0, sigma0, **arguments)


@pytest.mark.slow
def test_another_strategy_can_be_named_and_restarted():
    result = es.minimize(shifted_sphere, np.zeros(5), 0.5, strategy=es.SNES(popsize=12), max_evals=6000,
                         restarts="ipop", target=79.48 + 1e-6)
    assert result.success and result.restarts[0].popsize == 12
    assert math.isclose(result.fun, shifted_sphere(result.x))


README_FIRST_RUN = es.CMAES(popsize=7, sigma=2.0, maximize=False)
"""The README example's first run: the strategy of the tests that drive es.minimize's loop themselves."""


@functools.cache
def readme_loop_program():
    """The loop's program of ``README_FIRST_RUN`` on 3 params in float64, compiled once for those tests."""
    with float64():
        return loop.Loop.compile(README_FIRST_RUN, jnp.full(3, 3.0))


def readme_loop(compiled=None) -> loop.Loop:
    """A loop of ``README_FIRST_RUN`` from ``x0 = 3`` (call it under ``float64()``), with ``compiled`` or the
    shared program."""
    state = README_FIRST_RUN.init(jax.random.key(0), jnp.full(3, 3.0))
    return loop.Loop(README_FIRST_RUN, state, compiled or readme_loop_program())


@pytest.mark.parametrize("first, dim", [(7, 3), (6, 2), (10, 10), (12, 20), (15, 40), (17, 100)])
def test_a_schedules_popsizes_share_at_most_ten_padded_programs_of_bounded_work(first, dim):
    served = program_popsizes(first, dim, loop.SMALL_WORK)
    assert sorted(served) == [first * 2**k for k in range(MAX_RESTARTS + 1)]
    programs = sorted(set(served.values()))
    assert len(programs) <= MAX_RESTARTS + 1
    for popsize, program in served.items():
        assert program >= popsize and program in served  # a program of the schedule's own octaves
        small = program * dim <= loop.SMALL_WORK  # compiled without backend optimisation
        assert small == (loop.compiler_options(dim, "cpu", program).get("xla_backend_optimization_level") == 0)
        octaves = SMALL_OCTAVES if small else PADDED_OCTAVES  # a few octaves, and bounded work past the small
        assert program <= popsize * 2 ** (octaves - 1)
        assert small or program == popsize or program * dim**2 <= PAD_WORK
    small = [p for p in served if p * dim <= loop.SMALL_WORK]  # SMALL_OCTAVES to a program
    assert len({served[p] for p in small}) == -(-len(small) // SMALL_OCTAVES)


def test_a_padded_loop_runs_the_run_of_its_own_popsize():
    """A program of 56 members serving a run of 7 (``Loop(popsize=56)``): the run's 7 members, the same
    generations as the run's own program (members past 7 get no weight, NaN members the worst rank's, tied
    ones their ranks' mean), to the last bits that summing 56 rows instead of 7 may change."""
    with float64():
        state = README_FIRST_RUN.init(jax.random.key(0), jnp.full(3, 3.0))
        own, padded = readme_loop(), loop.Loop(README_FIRST_RUN, state, popsize=56)
        members, padded_members = own.first(), padded.first()
        for generation in range(30):
            assert np.shape(padded_members) == (7, 3)
            np.testing.assert_allclose(padded_members, members, rtol=1e-12, atol=1e-14)
            values = np.sum(np.asarray(members) ** 2, axis=1)
            values[generation % 7] = np.nan
            values[(generation + 1) % 7] = values[(generation + 2) % 7]  # a tie
            (summary, members), (padded_summary, padded_members) = own.step(values), padded.step(values)
            np.testing.assert_allclose(padded_summary, summary, rtol=1e-12)
            assert padded_summary[2] == summary[2]  # the same stop mask
    with pytest.raises(ValueError, match=r"Loop\(popsize=16\)"):
        loop.Loop(es.SNES(popsize=8, sigma=0.5), es.SNES(popsize=8, sigma=0.5).init(jax.random.key(0), jnp.ones(3)),
                  popsize=16)


def test_rank_weights_of_the_first_members_leave_the_others_out():
    """``rank_weights(..., members=m)``: the weights of the first ``m`` fitnesses alone (NaN and ties too),
    and 0 for the rest, whatever their fitness."""
    by_rank = np.array([0.5, 0.3, 0.2, 0.0, -0.1, -0.4])
    fitness = np.array([3.0, np.nan, 1.0, 3.0, 2.0, 0.5])
    alone = es.strategies.shaping.rank_weights(jnp.asarray(fitness), jnp.asarray(by_rank), False)
    padded = es.strategies.shaping.rank_weights(jnp.asarray(np.concatenate([fitness, [-5.0, np.nan, 9.0]])),
                                                jnp.asarray(np.concatenate([by_rank, np.zeros(3)])), False, 6)
    np.testing.assert_allclose(padded[:6], alone, rtol=1e-6)
    np.testing.assert_array_equal(padded[6:], 0.0)
    assert float(alone[1]) == float(padded[1]) == float(np.float32(-0.4))  # the invalid member: the worst rank's weight


def test_the_loop_tracks_the_best_value_and_leaves_the_best_point_to_its_driver():
    """es.minimize keeps its best point on the host: its loop's program leaves out the best member's rebuild."""
    with float64():
        the_loop = readme_loop()
        members = np.asarray(the_loop.first())
        values = np.sum(members**2, axis=1)
        the_loop.step(values)
    np.testing.assert_array_equal(the_loop.state.best_params, np.full(3, 3.0))
    assert float(the_loop.state.best_fitness) == values.min()


def test_a_sigma_factor_gives_in_the_same_call_the_members_of_the_state_with_sigma_changed():
    """Uncertainty handling's sigma increase: ``step(fitness, sigma_factor)`` is the step, then ``sigma`` times
    the factor on the host and ``first()`` again (what es.minimize(noisy=True) did in two calls), bit for bit."""
    with float64():
        one, two = readme_loop(), readme_loop()
        values = np.sum(np.asarray(one.first()) ** 2, axis=1)
        (summary, members), (expected, _) = one.step(values, sigma_factor=1.25), two.step(values)
        inner = two.state.strategy_state
        increased = jax.device_put(np.asarray(inner.sigma) * 1.25)
        two.state = two.state._replace(strategy_state=inner._replace(sigma=increased))
        expected_members = two.first()
        assert summary == expected
        chex.assert_trees_all_equal(one.state, two.state)
        np.testing.assert_array_equal(np.asarray(members), np.asarray(expected_members))
        with programs_built() as built:  # any factor: the same program, one call
            one.step(values, sigma_factor=1.1)
        assert built == []


def test_the_loops_program_takes_the_faster_compiling_options_on_a_cpu_for_small_programs_only():
    assert loop.compiler_options(3, "cpu") == loop.COMPILER_OPTIONS == {"xla_cpu_use_fusion_emitters": False}
    assert loop.compiler_options(es.noise.MIN_SLICE - 1, "cpu") == loop.COMPILER_OPTIONS
    assert loop.compiler_options(es.noise.MIN_SLICE, "cpu") is None  # the loop emitters' large sums run slower
    assert loop.compiler_options(3, "gpu") is None and loop.compiler_options(3, "tpu") is None
    # and without XLA's backend optimisation where params x popsize is small (the README example's 3 x 7 to 3 x 56)
    unoptimized = {**loop.COMPILER_OPTIONS, "xla_backend_optimization_level": 0}
    assert loop.compiler_options(3, "cpu", popsize=56) == loop.compiler_options(16, "cpu", popsize=16) == unoptimized
    assert loop.compiler_options(3, "cpu", popsize=112) == loop.compiler_options(40, "cpu", popsize=15) \
        == loop.COMPILER_OPTIONS
    assert loop.compiler_options(3, "gpu", popsize=7) is None


def test_an_xla_without_an_option_compiles_the_loop_with_the_others(monkeypatch):
    """jax 0.11's XLA has no ``xla_cpu_use_fusion_emitters``: the loop is compiled with the options that remain
    (here the optimisation level of a small first run), not with XLA's defaults."""
    monkeypatch.setattr(executable_cache, "directory", lambda: None)  # compiled here, never loaded
    assert loop.compiler_options(3, "cpu", README_FIRST_RUN.popsize)["xla_backend_optimization_level"] == 0
    with float64():
        monkeypatch.setattr(loop, "COMPILER_OPTIONS", {"xla_cpu_no_such_option": False})  # as XLA would refuse it
        fallback = readme_loop(loop.Loop.compile(README_FIRST_RUN, jnp.full(3, 3.0)))
        monkeypatch.setattr(loop, "COMPILER_OPTIONS", {})
        default = readme_loop(loop.Loop.compile(README_FIRST_RUN, jnp.full(3, 3.0)))  # the level alone, asked for
        members = np.asarray(fallback.first())
        np.testing.assert_array_equal(members, np.asarray(default.first()))
        values = np.sum(members**2, axis=1)
        (summary, following), (expected, expected_following) = fallback.step(values), default.step(values)
    assert summary == expected
    np.testing.assert_array_equal(np.asarray(following), np.asarray(expected_following))


def fitness_sequence(generations=700, popsize=6, seed=0):
    """Fitnesses that start flat, improve, stall in a flat band (tolfun, tolfunhist), lose members (NaN) and
    then only wander (stagnation, after the 500 generations its sparse history needs)."""
    rng = np.random.default_rng(seed)
    for g in range(generations):
        values = (1.0 - g / 200 if g < 200 else 0.0) + 1e-3 * rng.normal(size=popsize)
        if g < 12 or 80 <= g < 110:  # flat from the start: the conditions' first generations count
            values = np.full(popsize, 2.0 if g < 12 else 0.5)
        if g % 37 == 0:
            values[rng.integers(popsize)] = np.nan
        if g == 300:
            values[:] = np.nan
        yield values


@pytest.mark.parametrize("x64", [True, False], ids=["float64", "float32"])
def test_the_loops_host_history_finds_the_conditions_the_program_would(x64):
    """es.minimize's loop keeps the fitness history on the host (``es.engine.fitness_history``): generation by
    generation it finds ``tolfun``, ``tolfunhist`` and ``stagnation`` exactly when the program's history would."""
    dim, popsize, criteria = 2, 6, es.StopCriteria(tolstagnation=30)
    with float64() if x64 else contextlib.nullcontext():
        dtype = np.dtype(jnp.result_type(float))

        @jax.jit
        def program(history, value, residual):
            fitnesses = Fitnesses(value, residual)
            ranked, valid = rank(fitnesses, False)
            history = stopping.record(history, False, value, residual, ranked, valid)
            return history, stopping.history_conditions(history, dim, popsize, criteria)

        history = stopping.initial_history(dim, popsize, dtype)
        host = fitness_history.HostHistory(dim, popsize, dtype, False, criteria)
        met = {name: 0 for name in fitness_history.HISTORY_CRITERIA}
        for values in fitness_sequence(popsize=popsize):
            given = from_host(values * 1e3, "test", dtype)  # float32: residuals where float64 values rounded
            history, found = program(history, given.value, given.residual)
            host.record(given.value, given.residual)
            assert host.conditions() == {name: bool(v) for name, v in found.items()}
            for name, value in host.conditions().items():
                met[name] += value
    assert all(met.values()), met  # each condition met at some generation, and missed at others
    assert all(count < 700 for count in met.values()), met
