"""What the test files share: canonical problems and sizes, one instance of each strategy, processes.

Every compiled program is keyed by its strategy, shapes, generation count, fitness and mesh; a test that
uses the shared ones (``POPSIZE``, ``GENERATIONS``, ``STRATEGIES``, ``policy_params`` with
``noisy_policy_return``...) reuses a program another test compiled, in this process or, through JAX's
persistent compilation cache (tests/conftest.py), in another test file. Pick another size only where the
property under test needs it, and say why.
"""

from __future__ import annotations

import contextlib
import os
import time

import jax
import jax.numpy as jnp
import optax

import es
from es import executable_cache
from es.engine.compiler import compile_with
from es.parallel import collectives

POPSIZE = 32
"""The population of a test that needs "a population": divisible by 8 devices, pairs on each device."""
GENERATIONS = 3
"""Generations of a test that needs "a few generations" (a bit-identity, a continuation, a refusal)."""


def sphere(params, key):
    """Negated squared norm of any pytree (maximised at 0)."""
    del key
    return -sum(jnp.sum(x**2) for x in jax.tree.leaves(params))


def rastrigin(x, key):
    """Negated Rastrigin function (maximum 0 at x = 0)."""
    del key
    return -(10.0 * x.size + jnp.sum(x**2 - 10.0 * jnp.cos(2 * jnp.pi * x)))


FAIL_ALL_ABOVE = 1e6
"""``nan_for_some_members`` fails every member whose first coordinate is above this (a generation where all fail)."""


def nan_for_some_members(x, key):
    """Sphere on a vector, but NaN or +-inf for about a third of the members, and NaN for every member whose
    first coordinate is above ``FAIL_ALL_ABOVE`` (start there for generations where every member fails, in the
    same program)."""
    draw = jax.random.uniform(key)
    value = -jnp.sum(x**2)
    some = jnp.where(draw < 0.1, jnp.nan, jnp.where(draw < 0.2, jnp.inf, jnp.where(draw < 0.3, -jnp.inf, value)))
    return jnp.where(x[0] > FAIL_ALL_ABOVE, jnp.nan, some)


def noisy_policy_return(params, key, horizon=20, noise_scale=0.1):
    """A gymnax-like rollout: a scan whose carry starts from constants, a matmul, and the key."""
    w1, w2 = params["w1"], params["w2"]

    def step(carry, step_key):
        obs, total = carry
        action = jnp.tanh(jnp.tanh(obs @ w1) @ w2)
        obs = 0.9 * obs + 0.1 * action + noise_scale * jax.random.normal(step_key, obs.shape)
        return (obs, total - jnp.sum(obs**2)), None

    (_, total), _ = jax.lax.scan(step, (jnp.ones(4), 0.0), jax.random.split(key, horizon))
    return total


def policy_params(key=None):
    """The parameters of ``noisy_policy_return``: a 4-32-4 network (256 params)."""
    k1, k2 = jax.random.split(jax.random.key(1) if key is None else key)
    return {"w1": 0.1 * jax.random.normal(k1, (4, 32)), "w2": 0.1 * jax.random.normal(k2, (32, 4))}


# One instance of each strategy, with settings that suit the small test problems.
STRATEGIES = {
    "OpenES": es.OpenES(popsize=POPSIZE, sigma=0.1, optimizer=optax.adam(0.05)),
    "SNES": es.SNES(popsize=POPSIZE, sigma=0.3),
    "SNES-antithetic": es.SNES(popsize=POPSIZE, sigma=0.3, antithetic=True),
    "PGPE": es.PGPE(popsize=POPSIZE, sigma=0.3, optimizer=es.clipup(0.1, max_speed=0.2)),
    "ARS": es.ARS(popsize=POPSIZE, sigma=0.1, top_k=8, learning_rate=0.05),
    "SepCMAES": es.SepCMAES(popsize=POPSIZE, sigma=0.3),
}


def evolve(strategy, fitness_fn, params, generations=GENERATIONS, num_devices=1, seed=0, **execution):
    """``es.evolve`` of ``strategy`` from ``params`` (run key ``seed``) on ``num_devices`` devices (the state made
    with ``fitness_fn``: a stateful fitness's state included)."""
    state = strategy.init(jax.random.key(seed), params, fitness=fitness_fn)
    return es.evolve(strategy, fitness_fn, state, generations, mesh=es.make_mesh(num_devices), **execution)


def compiled_temp_bytes(lowered: jax.stages.Lowered) -> int:
    """XLA's temporary buffers of ``lowered``'s program, in bytes. Buffer assignment is made by XLA's HLO passes,
    so the program (never run) is compiled without LLVM's optimisation, as ``es.collectives_report`` does
    (``REPORT_COMPILER_OPTIONS``): the sizes of XLA's defaults (test_collectives.py; every program of the memory
    tests, docs/benchmarks.md) in about 0.55x the compile time."""
    return compile_with(lowered, collectives.REPORT_COMPILER_OPTIONS).memory_analysis().temp_size_in_bytes


PROGRAM_EVENT = "/jax/core/compile/backend_compile_duration"
"""JAX's monitoring event of a new program, whether XLA compiles it or loads it from the persistent cache."""


@contextlib.contextmanager
def programs_built():
    """Inside the block, ``built`` (yielded) lists the name of every program JAX built for it: compiled by XLA,
    or loaded from the persistent compilation cache or from ``es.executable_cache``."""
    built = []

    def listen(event, duration, fun_name="", **kwargs):
        if event in (PROGRAM_EVENT, executable_cache.LOAD_EVENT):
            built.append(fun_name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield built
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def wait_until_dead(pids, timeout: float = 10.0) -> list:
    """The processes of ``pids`` still alive after waiting up to ``timeout`` seconds for all to end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if pid_alive(p)]


def xla_flags_without_device_count() -> str:
    """This process's ``XLA_FLAGS`` less the emulated device count, for a child process that picks its own
    devices (``JAX_NUM_CPU_DEVICES``); any other XLA flag the suite was run with is kept."""
    return " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f)
