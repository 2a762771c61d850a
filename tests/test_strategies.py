"""What every strategy must show: device-count invariance, what crosses devices, NaN safety, clear errors,
ask/tell == evolve, tie-aware ranks, and that it optimises a sphere and a Rastrigin."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import FAIL_ALL_ABOVE, STRATEGIES, nan_for_some_members, rastrigin, sphere
from test_validation import raises

import es

IDS = list(STRATEGIES)


def evolve(strategy, fitness_fn, params, generations, num_devices=1, seed=0):
    state = strategy.init(jax.random.key(seed), params)
    return es.evolve(strategy, fitness_fn, state, generations, mesh=es.make_mesh(num_devices))


@pytest.mark.parametrize("name", IDS)
@pytest.mark.slow
def test_only_popsize_sized_vectors_cross_devices_at_100k_params_on_8_devices(name):
    strategy = STRATEGIES[name]
    params = {"w": jnp.zeros((250, 400)), "b": jnp.zeros(10)}  # 100,010 params in two leaves
    report = es.collectives_report(strategy, sphere, strategy.init(jax.random.key(0), params), es.make_mesh(8))
    assert report.num_devices == 8 and report.crossing, "the fitness exchange must appear"
    assert "all-gather" in {c.op for c in report.crossing}, str(report)
    assert all(c.bytes <= 4 * strategy.popsize for c in report.crossing), str(report)
    assert report.total_bytes <= 4 * strategy.popsize + 64, str(report)


def all_finite(tree) -> bool:
    return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact))


@pytest.mark.parametrize("name", IDS)
@pytest.mark.slow
def test_nan_and_inf_fitnesses_never_make_the_state_non_finite(name):
    strategy = STRATEGIES[name]
    state, metrics = evolve(strategy, nan_for_some_members, jnp.ones(20), 30, num_devices=8)
    assert all_finite((state.params, state.strategy_state))
    invalid = np.asarray(metrics["num_invalid"])
    assert invalid.sum() > 0 and np.all(invalid < strategy.popsize)
    assert np.all(np.isfinite(np.asarray(metrics["fitness_mean"])))  # over the valid members
    assert float(jnp.sum(state.params**2)) < 20.0  # still learns: started at 20
    # Generations where every member fails change nothing (the same program, from a mean where all fail).
    failing = state._replace(params=jnp.asarray(np.asarray(state.params)).at[0].set(10 * FAIL_ALL_ABOVE))
    failed, failed_metrics = es.evolve(strategy, nan_for_some_members, failing, 30, mesh=es.make_mesh(8))
    chex.assert_trees_all_equal((failed.params, failed.strategy_state), (failing.params, failing.strategy_state))
    assert np.all(np.asarray(failed_metrics["num_invalid"]) == strategy.popsize)
    assert np.all(np.isnan(np.asarray(failed_metrics["fitness_mean"])))


def quantized_sphere(x, key):
    """A sphere whose value is an exact integer sum, so batching cannot change its rounding."""
    del key
    return -jnp.sum(jnp.round(x * 100) ** 2)


@pytest.mark.parametrize("name", IDS)
@pytest.mark.slow
def test_ask_tell_gives_the_params_of_evolve_bit_for_bit(name):
    strategy = STRATEGIES[name]
    state = strategy.init(jax.random.key(3), jnp.linspace(-1.0, 1.0, 30))
    evolved, metrics = es.evolve(strategy, quantized_sphere, state, 4, mesh=es.make_mesh(4))
    for _ in range(4):
        population = es.ask(strategy, state)
        chex.assert_shape(population, (strategy.popsize, 30))
        fitness = np.array([float(quantized_sphere(member, None)) for member in population])
        state, told = es.tell(strategy, state, fitness)
    chex.assert_trees_all_equal(state, evolved)
    chex.assert_trees_all_equal(told, jax.tree.map(lambda m: m[-1], metrics))


def test_ask_tell_after_the_first_generation_traces_and_compiles_nothing():
    strategy = STRATEGIES["SNES"]
    state = strategy.init(jax.random.key(0), jnp.zeros(6))
    events = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kwargs: events.append(event) if event.startswith("/jax/core/compile") else None)
    per_generation = []
    for _ in range(3):
        events.clear()
        population = es.ask(strategy, state)
        state, _ = es.tell(strategy, state, np.sum(np.square(population), axis=1, dtype=np.float64))
        per_generation.append(list(events))
    assert per_generation[0], "the first generation compiles (the listener hears it)"
    assert per_generation[1:] == [[], []], per_generation[1:]


@pytest.mark.parametrize("name", ["SNES-antithetic", "SepCMAES"])
@pytest.mark.slow
def test_tell_builds_the_next_members_with_the_bits_of_ask(name):
    strategy = STRATEGIES[name]
    state = strategy.init(jax.random.key(0), jnp.zeros(6))
    for _ in range(3):
        population = es.ask(strategy, state)
        state, _ = es.tell(strategy, state, np.sum(np.square(population), axis=1, dtype=np.float64))
    built = es.ask(strategy, state)  # built by tell, handed back
    assert es.ask(strategy, state) is built
    fresh = es.ask(strategy, jax.tree.map(lambda x: x, state))  # another State object: ask builds them itself
    assert fresh is not built
    chex.assert_trees_all_equal(fresh, built)


def test_tell_returns_the_runs_key_itself_and_checks_a_state_it_returned_only_once(monkeypatch):
    """The key never changes in a generation: tell hands back the caller's key array, not a copy of it from
    the program; and the state tell returned passed the checks already (the first tell alone checks)."""
    strategy = STRATEGIES["SNES"]
    state = strategy.init(jax.random.key(0), jnp.zeros(6))
    population = es.ask(strategy, state)
    state, _ = es.tell(strategy, state, np.sum(np.square(population), axis=1))
    key = state.key
    checks = []
    checked = es.engine.ask_tell._checked
    monkeypatch.setattr(es.engine.ask_tell, "_checked", lambda *args: checks.append(args) or checked(*args))
    for _ in range(3):
        population = es.ask(strategy, state)
        state, _ = es.tell(strategy, state, np.sum(np.square(population), axis=1))
        assert state.key is key
    assert checks == []
    es.tell(strategy, jax.tree.map(lambda x: x, state), np.zeros(strategy.popsize))  # another State object
    assert len(checks) == 1


@pytest.mark.slow
def test_ask_builds_a_chunk_of_members_at_a_time():
    strategy = STRATEGIES["SNES"]
    state = strategy.init(jax.random.key(0), {"w": jnp.ones((3, 4)), "b": jnp.zeros(2)})
    everyone = es.ask(strategy, state)
    chunks = [es.ask(strategy, state, members=range(start, start + 8)) for start in range(0, 32, 8)]
    chex.assert_trees_all_equal(jax.tree.map(lambda *c: jnp.concatenate(c), *chunks), everyone)
    assert everyone["w"].shape == (32, 3, 4)


@pytest.mark.parametrize("name", IDS)
@pytest.mark.parametrize("problem", ["sphere", "rastrigin"])
def test_it_optimises_a_sphere_and_a_rastrigin(name, problem):
    strategy = STRATEGIES[name]
    fitness_fn = {"sphere": sphere, "rastrigin": rastrigin}[problem]
    x0 = jnp.full(10, 2.5)  # half-way between Rastrigin's local optima
    start = float(fitness_fn(x0, None))
    state, metrics = evolve(strategy, fitness_fn, x0, 150, num_devices=2)
    final = float(fitness_fn(state.params, None))
    if problem == "sphere":
        assert final > 0.05 * start, (start, final)  # within 5% of the way from 0 (fitness is negative)
    else:
        assert final > 0.6 * start, (start, final)  # Rastrigin: at least 40% of the way, past local optima


@pytest.mark.parametrize("name", IDS)
@pytest.mark.slow
def test_tied_fitnesses_get_equal_weights(name):
    strategy = STRATEGIES[name]
    state = strategy.init(jax.random.key(0), jnp.zeros(5))
    # Pairs of equal fitnesses; ARS scores directions, so there whole (+, -) pairs are repeated.
    values = jnp.repeat(jnp.arange(strategy.popsize // 4, dtype=jnp.float32), 2)
    fitness = jnp.concatenate([values, values]) if name == "ARS" else jnp.repeat(values, 2)
    coefficients = strategy.coefficients(strategy.hyperparameters(5), state.strategy_state, fitness)
    for coefs in coefficients:
        if coefs is None:
            continue
        coefs = np.asarray(coefs)
        for value in np.unique(np.asarray(fitness)):
            members = np.flatnonzero(np.asarray(fitness) == value)
            if name == "ARS":  # members of equal (+, -) pairs share |a|
                coefs = np.abs(coefs)
            assert np.all(coefs[members] == coefs[members[0]]), (value, coefs[members])


@pytest.mark.parametrize(
    "make, exc, fragments",
    [
        (lambda: es.SNES(popsize=1), ValueError, ["SNES(popsize=1)", "at least 2"]),
        (lambda: es.SNES(popsize=2**31), ValueError, ["SNES(popsize=2147483648)", "at most", "es.evolve_many"]),
        (lambda: es.CMAES(popsize=10**12), ValueError, ["CMAES(popsize=1000000000000)", "at most"]),
        (lambda: es.SNES(popsize=8, sigma=0.0), ValueError, ["SNES(sigma=0.0)", "> 0"]),
        (lambda: es.SNES(popsize=7, antithetic=True), ValueError, ["popsize=7", "even", "antithetic=False"]),
        (lambda: es.SNES(popsize=8, learning_rate=-1.0), ValueError, ["SNES(learning_rate=-1.0)", "> 0"]),
        (lambda: es.optimizers.make("adam", learning_rate=-0.1), ValueError,
         ["es.optimizers.make('adam', learning_rate=-0.1)", "negative learning_rate", "positive"]),
        (lambda: es.SNES(popsize=8, sigma_learning_rate="fast"), TypeError, ["sigma_learning_rate", "float"]),
        (lambda: es.SNES(popsize=8, temperature=0.0), ValueError, ["SNES(temperature=0.0)", "> 0", "None"]),
        (lambda: es.PGPE(popsize=7), ValueError, ["PGPE(popsize=7", "always samples pairs", "popsize=8"]),
        (lambda: es.PGPE(popsize=8, optimizer=optax.adam), TypeError, ["PGPE(optimizer=", "optax.GradientTransformation"]),
        (lambda: es.PGPE(popsize=8, sigma_max_change=1.5), ValueError, ["sigma_max_change=1.5", "(0, 1.0]"]),
        (lambda: es.PGPE(popsize=8, sigma_learning_rate=-0.1), ValueError, ["sigma_learning_rate=-0.1", ">= 0"]),
        (lambda: es.PGPE(popsize=8, fitness_shaping="rank"), ValueError, ["fitness_shaping='rank'", "centered_rank"]),
        (lambda: es.ARS(popsize=8, top_k=5), ValueError, ["ARS(top_k=5, popsize=8)", "top_k <= 4"]),
        (lambda: es.ARS(popsize=8, top_k=0), ValueError, ["ARS(top_k=0)", "at least 1"]),
        (lambda: es.ARS(popsize=8, top_k=2.0), TypeError, ["ARS(top_k=2.0)", "int"]),
        (lambda: es.ARS(popsize=8, learning_rate=float("nan")), ValueError, ["learning_rate=nan", "finite"]),
        (lambda: es.SepCMAES(popsize=3), ValueError, ["SepCMAES(popsize=3)", "at least 4"]),
        (lambda: es.SepCMAES(popsize=8, sigma=-1.0), ValueError, ["SepCMAES(sigma=-1.0)", "> 0"]),
        (lambda: es.SepCMAES(popsize=8, maximize=1), TypeError, ["maximize=1", "True or False"]),
        (lambda: es.SepCMAES(popsize=8, noise="table"), TypeError, ["noise=", "es.NoiseTable"]),
        (lambda: es.SNES(popsize=8, exchange="gradient"), TypeError, ["SNES(exchange=...)", "es.evolve("]),
        (lambda: es.clipup(0.1, max_speed=0.0), ValueError, ["es.clipup(max_speed=0.0)", "> 0"]),
        (lambda: es.clipup(0.1, 0.2, momentum=1.0), ValueError, ["es.clipup(momentum=1.0)"]),
    ],
)
def test_bad_hyperparameters_are_refused_naming_the_argument_and_the_fix(make, exc, fragments):
    with raises(exc, *fragments):
        make()


def test_a_state_of_another_strategy_kind_is_refused():
    state = STRATEGIES["SNES"].init(jax.random.key(0), jnp.ones(4))
    with raises(ValueError, "state.strategy_state does not match this SepCMAES", "strategy.init"):
        es.evolve(STRATEGIES["SepCMAES"], sphere, state, 1)


def test_clipup_normalises_the_gradient_and_caps_the_speed():
    optimizer = es.clipup(learning_rate=0.1, max_speed=0.25, momentum=0.9)
    params = {"a": jnp.zeros(3), "b": jnp.zeros(2)}
    state = optimizer.init(params)
    gradient = {"a": jnp.array([30.0, 0.0, -40.0]), "b": jnp.zeros(2)}  # norm 50
    updates, state = optimizer.update(gradient, state, params)
    np.testing.assert_allclose(updates["a"], [-0.06, 0.0, 0.08], rtol=1e-6)  # -0.1 * g / |g|
    for _ in range(30):
        updates, state = optimizer.update(gradient, state, params)
    assert float(optax.tree.norm(updates)) == pytest.approx(0.25, rel=1e-6)  # v would reach 1.0 unclipped


def test_describe_names_the_strategy_and_its_default_optimizer():
    described = es.PGPE(popsize=8).describe()
    assert described["name"] == "PGPE" and described["popsize"] == 8
    assert described["optimizer"] == {"name": "clipup", "learning_rate": 0.15, "max_speed": 0.3}
    assert es.OpenES(popsize=8, optimizer=optax.sgd(0.1)).describe()["optimizer"].startswith("<")
    assert es.PGPE(popsize=8) == es.PGPE(popsize=8)  # the default optimizer is shared: one compilation


def test_strategies_differing_only_in_sigma_share_one_program_when_they_share_the_optimizer_object():
    adam = optax.adam(0.05)  # optax objects compare by identity; es.optimizers.make shares one per arguments
    assert es.OpenES(popsize=8, sigma=0.1, optimizer=adam).program() == es.OpenES(popsize=8, sigma=0.2,
                                                                                  optimizer=adam).program()
    made = [es.OpenES(popsize=8, sigma=s, optimizer=es.optimizers.make("adam", learning_rate=0.05)) for s in (0.1, 0.2)]
    assert made[0].program() == made[1].program()
    assert es.OpenES(popsize=8, optimizer=optax.adam(0.05)).program() != es.OpenES(
        popsize=8, optimizer=optax.adam(0.05)).program()  # two objects: two programs (the docstring's advice)
