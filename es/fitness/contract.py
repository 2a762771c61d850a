"""The fitness contract: what the engine calls on whatever evaluates the members.

Every entry point (``es.evolve``, ``es.run``, ``es.tell``, ``es.evolve_many``, ``es.minimize``) adapts the
user's fitness once, with ``es.fitness.adapter``, into an object of this Protocol: a JAX function or an
``es.StatefulFitness`` becomes a ``JaxFitness``, an ``es.CommonRandomNumbers`` its fitness's adapter with
shared keys, and an ``es.HostFitness`` (worker processes) is one itself. The engine never asks what kind
it has.

Fitnesses cross into the engine as ``Fitnesses(value, residual)``: ``value`` in the fitness dtype
(float32; float64 under ``jax_enable_x64``) and, for values computed outside JAX in float64, the
``residual`` that rounding dropped, so that ranks and steps see differences down to float64's resolution
(``es.engine.exchange.ranked``).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import numpy as np

PyTree = Any


class Fitnesses(NamedTuple):
    """The fitnesses of some members.

    Attributes:
      value: ``float[n]`` in the fitness dtype (``fitness_dtype()``): what
        metrics and the best member report.
      residual: ``float[n]``, ``f - value`` for values that carried more
        precision than the fitness dtype (float64 from the host), or ``None``
        where the values are exact (every JAX fitness).
    """

    value: jax.Array
    residual: jax.Array | None = None


def fitness_dtype() -> np.dtype:
    """The dtype the engine keeps fitnesses in: float32, or float64 under ``jax_enable_x64`` (as
    ``jnp.result_type(float)``, read from the flag: this runs once per ``es.tell``)."""
    return _FLOAT64 if jax.config.jax_enable_x64 else _FLOAT32


_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)


@functools.lru_cache(maxsize=None)
def _largest(dtype: np.dtype) -> float:
    return float(np.finfo(dtype).max)


def from_host(values, where: str, dtype=None) -> Fitnesses:
    """Host values (any real array) as ``Fitnesses``: rounded to ``dtype`` (default: the fitness dtype of this
    thread), and the residual in it.

    Raises ``ValueError`` for a finite value beyond the dtype's range (it would become inf).
    """
    exact = np.asarray(values, np.float64)
    dtype = np.dtype(fitness_dtype() if dtype is None else dtype)
    if dtype == _FLOAT64:  # nothing to round (a copy: the caller may reuse its array)
        return Fitnesses(exact.copy(), np.zeros_like(exact))
    largest = _largest(dtype)
    finite = np.isfinite(exact)
    big = finite & (np.abs(exact) > largest)
    if big.any():
        i = int(np.flatnonzero(big)[0])
        raise ValueError(
            f"{where}: fitness[{i}] = {float(exact[i])!r} is beyond {dtype.name}'s range (+-{largest:.3g}), "
            "where it would become inf and rank as an invalid member; rescale the objective (e.g. a log), "
            "return inf or NaN on purpose to mark the member invalid, or enable jax_enable_x64 for float64."
        )
    value = exact.astype(dtype)
    with np.errstate(invalid="ignore"):
        residual = np.where(finite, exact - value, 0.0).astype(dtype)
    return Fitnesses(value, residual)


class FitnessError(RuntimeError):
    """A fitness failed: on the host, ``fn`` raised, its worker died, or it exceeded ``timeout_s``
    (``es.HostFitness``); or a JAX fitness raised while es traced it, before anything compiled (the message
    names the line of the fitness it came from).

    Raised by ``es.evolve`` and ``es.run`` after the generation that failed
    (``es.run`` first checkpoints the segments that completed). The message
    names the generation, the member, its seed and, when ``fn`` raised, the
    original error with the worker's traceback. In a multi-process run it
    also names the process.
    """


@runtime_checkable
class Fitness(Protocol):
    """What the engine calls on an adapted fitness.

    Attributes:
      on_host: evaluated outside JAX (in worker processes): the engine calls
        ``evaluate_host`` between compiled programs instead of tracing
        ``evaluate`` (``es.engine.host_loop``).
      shared_by: who shares an evaluation key (``es.engine.members.EVAL_KEY_SHARING``).
      stateful: carries population-wide state (``init``/``update``, per-member stats).
    """

    on_host: bool
    shared_by: str
    stateful: bool

    def initial_state(self) -> PyTree:
        """The fitness state a new run starts from (``None`` unless stateful)."""

    def update_state(self, fitness_state: PyTree, stats: PyTree) -> PyTree:
        """The fitness state after a generation whose members returned ``stats`` (leading axis popsize)."""

    def check(self, params: PyTree, key: jax.Array, fitness_state: PyTree, popsize: int) -> None:
        """Raise ``TypeError`` before compiling unless the fitness accepts these inputs (and a generation of
        ``popsize`` members' stats)."""

    def default_eval_batch_size(self, popsize: int, antithetic: bool, dim: int) -> int:
        """Members each device evaluates together when ``eval_batch_size=None``."""

    def evaluate(self, members: Any, chunk: jax.Array, fitness_state: PyTree, pairs: bool,
                 shared_by: str = "member") -> tuple[Fitnesses, PyTree]:
        """``(Fitnesses, stats)`` of the members ``chunk`` of the generation ``members`` (traced; not
        ``on_host``)."""

    def evaluate_host(self, generation: int | None, members: np.ndarray, seeds: np.ndarray, params: PyTree,
                      fitness_state: PyTree) -> tuple[np.ndarray, PyTree, str | None]:
        """``(float64 fitnesses, stats, failure)`` of the members ``members`` (indices) from their numpy
        ``params`` (leading axis: the members) and ``seeds``, in one host dispatch (``on_host`` only)."""

    def close(self) -> None:
        """Release what the fitness holds (worker processes)."""
