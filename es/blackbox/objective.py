"""What ``es.minimize`` minimises: a JAX function, any Python callable, or an ``es.HostFitness``.

- ``"jax"``: ``fun(x) -> scalar`` that traces on ``x0``'s shapes, its value computed from ``x``: evaluated
  inside the compiled generation, members batched and sharded as ``es.evolve`` does it.
- ``"python"``: any other callable (a ``cocoex`` problem, a simulator, numpy code): called in the calling
  process, one member at a time, with a float64 numpy array shaped like ``x0`` (or a pytree of them).
- ``"host"``: an ``es.HostFitness``: ``fn(params, seed)`` in worker processes.

A Python callable that happens to trace as JAX code is evaluated as JAX (once traced, its Python side
effects do not run per member); wrap it in ``es.HostFitness`` to keep it on the host in workers. One whose
traced value does not depend on ``x`` (a branch that returned a constant) is taken for a Python callable.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import jax
from jax.extend import core as jax_core
import numpy as np

from es import validation
from es.host import HostFitness

PyTree = Any
KINDS = ("jax", "python", "host")


def kind_of(fun: Any, x0: PyTree) -> str:
    """``"jax"``, ``"python"`` or ``"host"`` (module docstring); ``TypeError`` for what is none of them, or for a
    JAX function that does not return one real number."""
    if isinstance(fun, HostFitness):
        return "host"
    if not callable(fun):
        raise TypeError(
            f"es.minimize(fun={fun!r}): fun must be callable as fun(x) -> float (a JAX function, any Python "
            "callable such as a cocoex problem) or an es.HostFitness."
        )
    out = traced_output(fun, x0)
    if out is None:
        return "python"
    if not isinstance(out, jax.ShapeDtypeStruct) or out.shape != () or not validation.real_dtype(out.dtype):
        got = validation.shapes(out)
        raise TypeError(
            f"es.minimize(fun=...): fun(x) must return one real number, but for x shaped like x0 it returns {got}; "
            "reduce it to a scalar, e.g. jnp.sum(...)."
        )
    return "jax"


def traced_output(fn: Callable, x0: PyTree) -> PyTree | None:
    """The shapes and dtypes of ``fn(x)`` for a float64 ``x`` shaped like ``x0`` when ``fn`` traces as JAX code
    whose value is computed from ``x``; ``None`` for a Python callable: one that does not trace, or whose traced
    value does not depend on ``x`` (a branch that returned a constant this time; its other branches may not trace).

    Traced under ``float64()``, as the call evaluates ``fn``: a trace that fails part-way (a Python callable's)
    leaves JAX 0.10 with a copy of each numpy constant it closed over in that trace's precision, which a later
    trace in the other precision picks up and fails to compile with (a JAX function and a Python ``g`` sharing a
    module-level ``np.array``)."""
    spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.float64), x0)
    with float64():
        try:  # through a fresh lambda: jax.jit keys its cache on (a weak reference to) the function it is given,
            # which crashes the process for extension objects such as cocoex problems once they are freed
            traced, out = jax.make_jaxpr(lambda x: fn(x), return_shape=True)(spec)
        except Exception:  # noqa: BLE001 - it does not trace
            return None
    return out if _depends_on_input(traced.jaxpr) else None


@contextlib.contextmanager
def float64():
    """``jax_enable_x64`` on for the duration of the call, and back as it was.

    The global setting, not ``jax.enable_x64``'s thread-local one: XLA's callback threads and an
    ``es.HostFitness``'s dispatch thread see it too, and jax 0.10's caches of ``jax.numpy`` helpers mix
    float32 and float64 constants across thread-local contexts.
    """
    was = bool(jax.config.jax_enable_x64)
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", was)


def _depends_on_input(jaxpr) -> bool:
    """Whether any output of ``jaxpr`` is computed from its inputs (not a constant of the trace)."""
    reached = set(jaxpr.invars)
    for equation in jaxpr.eqns:
        if any(not isinstance(v, jax_core.Literal) and v in reached for v in equation.invars):
            reached.update(equation.outvars)
    return any(not isinstance(v, jax_core.Literal) and v in reached for v in jaxpr.outvars)


@functools.lru_cache(maxsize=64)
def as_fitness(fun: Callable) -> Callable:
    """``fun(x)`` as the engine's ``fitness_fn(params, key)``: one wrapper per function (so its compiled
    programs are reused by later calls)."""
    return lambda params, key: fun(params)


def value_of(fun: Callable, x: PyTree, where: str) -> float:
    """``fun(x)`` as a float, or ``TypeError`` naming what it returned."""
    value = fun(x)
    if isinstance(value, float):  # a Python float or np.float64 (a subclass): the common case, checked cheaply
        return float(value)
    array = np.asarray(value) if value is not None else np.asarray(None, object)
    if array.shape != () or not validation.real_dtype(array.dtype):
        shape = getattr(x, "shape", None)
        raise TypeError(
            f"es.minimize(fun=...): fun must return one real number; {where} (x of shape {shape}) it returned "
            f"{value!r}. Return a float (e.g. float(np.sum(x**2))), or inf/NaN to mark a point infeasible."
        )
    return float(array)
