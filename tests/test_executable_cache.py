"""es.executable_cache: es.minimize's loop programs found on disk by their configuration, without tracing, and
running bit for bit as compiled; an entry that cannot serve is never used and never fails a call."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import programs_built, xla_flags_without_device_count
from test_minimize import README_FIRST_RUN, readme_loop

import es
from es import executable_cache
from es.blackbox.minimize import float64
from es.engine import loop
from es.strategies.margin import IntegerMargin, attached

X0 = np.full(3, 3.0)  # float64, as es.minimize passes x0


@pytest.fixture
def entries(tmp_path):
    """JAX's cache, and so this one, in ``tmp_path`` (empty: every program is compiled), and its entries' folder;
    the session's cache directory again afterwards."""
    previous = jax.config.jax_compilation_cache_dir
    jax.clear_caches()  # nor compiled earlier in this process (by tests/test_minimize.py, run in one pytest with it)
    es.enable_compilation_cache(tmp_path)
    try:
        yield tmp_path / executable_cache.SUBDIRECTORY
    finally:
        es.enable_compilation_cache(previous)


def never_compiled(*args):
    raise AssertionError("compiled, where the entry on disk should have served")


def run_loop(compiled, generations=3):
    """The README's first run driven by ``compiled`` for a few generations: every output it gives."""
    the_loop = readme_loop(compiled)
    members, outputs = np.asarray(the_loop.first()), []
    for _ in range(generations):
        summary, members = the_loop.step(np.sum((members - 1.0) ** 2, axis=1))
        members = np.asarray(members)
        outputs.append((summary, members))
    return outputs, jax.tree.map(as_numpy, the_loop.state)


def as_numpy(leaf):
    return np.asarray(jax.random.key_data(leaf) if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key) else leaf)


def test_a_stored_loop_program_is_loaded_without_tracing_and_runs_bit_for_bit_as_compiled(entries, monkeypatch):
    with float64():
        compiled = loop.Loop.compile(README_FIRST_RUN, X0)  # compiled here, and stored
        assert len(list(entries.glob("*.pkl"))) == 1
        monkeypatch.setattr(loop.Loop, "_compiled", never_compiled)
        with programs_built() as built:
            loaded = loop.Loop.compile(README_FIRST_RUN, X0)
        assert built == ["jit(_tell_ask_compiled)"]  # one program built: loaded, and counted as built
        (got, got_state), (expected, expected_state) = run_loop(loaded), run_loop(compiled)
    for (summary, members), (expected_summary, expected_members) in zip(got, expected):
        assert summary == expected_summary
        np.testing.assert_array_equal(members, expected_members)
    jax.tree.map(np.testing.assert_array_equal, got_state, expected_state)


def test_another_popsize_dimension_dtype_or_margin_is_another_entry(entries):
    keys = set()
    for strategy, params in [(README_FIRST_RUN, X0), (dataclasses.replace(README_FIRST_RUN, popsize=8), X0),
                             (README_FIRST_RUN, np.zeros(4)),
                             (attached(README_FIRST_RUN, IntegerMargin((0,), (-5.0,), (5.0,))), X0)]:
        keys.add(executable_cache.key(("es.engine.loop.Loop", strategy.program(), params.shape)))
    with float64():
        keys.add(executable_cache.key(("es.engine.loop.Loop", README_FIRST_RUN.program(), X0.shape)))
    assert len(keys) == 5 and None not in keys


def test_a_configuration_holding_a_function_is_never_stored(entries):
    strategy = es.OpenES(popsize=8, sigma=0.1, optimizer=optax.adam(1e-2))  # its optimizer: functions
    assert executable_cache.key(("es.engine.loop.Loop", strategy.program())) is None
    calls = []
    assert executable_cache.load_or_compile(strategy.program(), lambda: calls.append(1) or "compiled") == "compiled"
    assert calls == [1] and not entries.exists()


def test_a_program_calling_back_into_python_is_never_stored(entries):
    def with_callback(x):
        return jax.pure_callback(lambda v: np.asarray(v) + 1, jax.ShapeDtypeStruct((), jnp.float32), x)

    executable_cache.store("callback", jax.jit(with_callback).lower(jnp.float32(1)).compile())
    executable_cache.store("plain", jax.jit(lambda x: x + 1).lower(jnp.float32(1)).compile())
    assert sorted(p.name for p in entries.iterdir()) == ["plain.pkl"]


def test_a_program_that_jaxs_own_cache_gave_is_not_stored(entries):
    """XLA serializes an executable it loaded from JAX's cache to an entry whose first call fails: never stored."""
    def quarter():  # lowered anew each time: its compile goes to JAX's cache
        return jax.jit(lambda x: x / 4).lower(jnp.float32(1))

    quarter().compile()  # compiled outside: in JAX's cache only
    compiled, from_jax_cache = executable_cache._compiled_here(quarter().compile)
    assert from_jax_cache and float(compiled(jnp.float32(2))) == 0.5
    executable_cache.load_or_compile(("quarter",), quarter().compile)
    assert not list(entries.glob("*.pkl"))


def test_a_program_stored_here_is_not_written_to_jaxs_cache_too(entries):
    def third():
        return jax.jit(lambda x: x / 3).lower(jnp.float32(1))

    executable_cache.load_or_compile(("third",), third().compile)
    assert len(list(entries.glob("*.pkl"))) == 1
    assert not [path for path in entries.parent.iterdir() if path.name.startswith("jit__lambda")]  # no JAX entry
    compiled, from_jax_cache = executable_cache._compiled_here(third().compile)
    assert not from_jax_cache and float(compiled(jnp.float32(3))) == 1.0


def test_a_damaged_entry_is_removed_and_compiled_again(entries):
    name = executable_cache.key(("damaged",))
    entries.mkdir()
    (entries / f"{name}.pkl").write_bytes(b"\x00garbage" * 8)
    compiled = executable_cache.load_or_compile(("damaged",), jax.jit(lambda x: x * 3).lower(jnp.float32(1)).compile)
    assert float(compiled(jnp.float32(2))) == 6.0
    assert float(executable_cache.load(name)(jnp.float32(3))) == 9.0  # the damaged file replaced by a whole entry


def test_a_directory_that_cannot_be_written_never_fails_the_call(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setattr(executable_cache, "directory", lambda: blocked / "es-executables")
    program = jax.jit(lambda x: x * 2).lower(jnp.float32(1)).compile()
    assert executable_cache.load_or_compile(("blocked",), lambda: program) is program


def test_the_least_recently_used_entries_go_beyond_max_entries(entries, monkeypatch):
    monkeypatch.setattr(executable_cache, "MAX_ENTRIES", 2)
    program = jax.jit(lambda x: x - 1).lower(jnp.float32(1)).compile()
    for age, name in enumerate(["old", "used", "new"]):
        executable_cache.store(name, program)
        os.utime(entries / f"{name}.pkl", (1000.0 + age, 1000.0 + age))
    assert sorted(p.stem for p in entries.glob("*.pkl")) == ["new", "used"]
    assert float(executable_cache.load("used")(jnp.float32(3))) == 2.0


def test_the_cache_is_off_where_jaxs_persistent_cache_is_off():
    assert executable_cache.directory() is not None  # the session's cache (tests/conftest.py)
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        assert executable_cache.directory() is None
    finally:
        jax.config.update("jax_enable_compilation_cache", True)


# --------------------------------------------------------------------------- es.minimize's default, across processes

CHILD = """
import json, numpy as np, jax, es
counts = {"requests": 0, "hits": 0}
def listen(event, **kwargs):
    counts["requests"] += event.endswith("/compile_requests_use_cache")
    counts["hits"] += event.endswith("/cache_hits")
jax.monitoring.register_event_listener(listen)
result = es.minimize(lambda x: float(np.sum((x - 1.0) ** 2)), np.zeros(2), 0.5, max_evals=60)
print(json.dumps({**counts, "dir": jax.config.jax_compilation_cache_dir, "nfev": result.nfev}))
"""
CACHE_VARIABLES = ("ES_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                   "JAX_COMPILATION_CACHE_MAX_SIZE")


def minimize_in_a_child(tmp_path, **variables) -> dict:
    """A small es.minimize in a fresh process whose cache settings are only ``variables`` (the user's cache home
    in ``tmp_path / "home"``): the cache directory JAX used and its compile requests and cache hits."""
    env = {name: value for name, value in os.environ.items() if name not in CACHE_VARIABLES}
    env.update(XDG_CACHE_HOME=str(tmp_path / "home"), XLA_FLAGS=xla_flags_without_device_count(), **variables)
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # child processes
def test_es_minimize_caches_by_default_and_a_second_process_compiles_nothing(tmp_path):
    first, second = (minimize_in_a_child(tmp_path) for _ in range(2))
    home = tmp_path / "home" / "es" / "jax"  # $XDG_CACHE_HOME/es/jax
    assert first["dir"] == second["dir"] == str(home) and any(home.iterdir())
    assert first["requests"] > first["hits"]  # compiled, and written
    assert second["requests"] == second["hits"]  # every program it asked JAX for was in the cache
    assert first["nfev"] == second["nfev"] == 60


@pytest.mark.slow  # child processes
def test_es_compilation_cache_off_leaves_it_off_and_a_users_own_directory_is_kept(tmp_path):
    off = minimize_in_a_child(tmp_path, ES_COMPILATION_CACHE="off")
    assert off["dir"] is None and off["hits"] == 0 and not (tmp_path / "home").exists()
    mine = minimize_in_a_child(tmp_path, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "mine"))
    assert mine["dir"] == str(tmp_path / "mine") and any((tmp_path / "mine").iterdir())
    assert not (tmp_path / "home").exists()


def test_enable_compilation_cache_refuses_what_is_not_a_directory_path():
    for directory in (123, "", "  "):
        with pytest.raises(TypeError, match=r"es.enable_compilation_cache\(directory=.*give a directory path"):
            es.enable_compilation_cache(directory)
