"""``es.HostFitness``: a fitness that is not JAX, evaluated in a pool of worker processes (``es/host/pool.py``).

    fitness = es.HostFitness(simulate, num_workers=None, timeout_s=60.0)   # simulate(params, seed) -> float
    state, metrics = es.evolve(strategy, fitness, state, 100, mesh=mesh)

It implements the engine's ``es.fitness.Fitness`` contract itself (``on_host``): each generation's members
are built by a compiled program, this process's share is evaluated in one dispatch to the pool, whose
fitnesses (float64) go back to the devices for the update (``es.engine.host_loop``), so no device waits in a
collective while the host evaluates. The pool's module docstring says how failures, timeouts and Ctrl-C end a
call; ``evaluate_batch`` evaluates any batch of params, for an ask/tell loop of your own.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import jax
import numpy as np

from es import validation
from es.fitness.contract import FitnessError
from es.fitness.functions import unbindable
from es.host.pool import _Pool, available_cores

PyTree = Any


def _check_arity(fn: Callable, count: int) -> None:
    """A ``TypeError`` now, not in a worker after compiling, where ``fn`` cannot take ``count`` positional
    arguments (``(params, seed)``, or ``(params, seed, fitness_state)`` when stateful)."""
    signature = unbindable(fn, count)
    if signature is not None:
        names = "params, seed, fitness_state" if count == 3 else "params, seed"
        raise TypeError(
            f"es.HostFitness(fn={getattr(fn, '__name__', fn)!s}): fn is called as fn({names}), but its signature "
            f"is {signature}; give it those {count} arguments (e.g. def simulate({names}): ...)."
        )


@dataclasses.dataclass(frozen=True, eq=False)
class HostFitness:
    """A fitness that is not JAX: ``fn(params, seed) -> float``, run in worker processes.

    Pass it to ``es.evolve``, ``es.run`` or a multi-process run as the
    fitness. Each device's members are evaluated in one batch, in parallel
    across the workers of this process's pool (see the module docstring).

    Args:
      fn: ``fn(params, seed) -> float`` for one member: ``params`` a pytree
        of numpy arrays shaped like the state's params, ``seed`` an int (a
        uint32 drawn from the member's evaluation key, see ``member_seed``).
        Higher is better when the strategy maximises; NaN or inf marks the
        member invalid. Any picklable callable, lambdas and closures included
        (shipped with ``cloudpickle``).
      num_workers: worker processes of this process's pool; ``None``: the
        cores this process may use (``os.sched_getaffinity``).
      timeout_s: seconds one member's evaluation may take before its worker
        is stopped and the run fails with ``FitnessError``; ``None``: no limit.
      init: with ``update`` and ``stats``, makes the fitness stateful (as
        ``es.StatefulFitness``): ``init() -> fitness_state``, a pytree of JAX
        arrays (``strategy.init(key, params, fitness=...)`` calls it). ``fn``
        is then called as ``fn(params, seed, fitness_state) -> (fitness,
        stats)`` with ``fitness_state`` as numpy arrays.
      update: ``update(fitness_state, stats) -> fitness_state``, JAX code run
        by the engine after each generation; ``stats`` has the structure of
        ``stats`` with a leading ``popsize`` axis, in member order.
      stats: the shapes and dtypes of one member's statistics: a pytree of
        ``jax.ShapeDtypeStruct`` (or arrays), as ``jax.pure_callback`` takes.

    The pool starts at the first evaluation and stays up between calls;
    ``close()`` (or ``with es.HostFitness(...) as fitness:``) stops it, as
    does a ``FitnessError``, Ctrl-C, the end of an ``es.run`` and the end of
    the interpreter.
    """

    fn: Callable
    num_workers: int | None = None
    timeout_s: float | None = None
    _: dataclasses.KW_ONLY
    init: Callable[[], PyTree] | None = None
    update: Callable[[PyTree, PyTree], PyTree] | None = None
    stats: PyTree = None

    def __post_init__(self):
        if not callable(self.fn):
            raise TypeError(f"es.HostFitness(fn={self.fn!r}): fn must be callable as fn(params, seed) -> float.")
        if self.num_workers is not None:
            validation.check_int("es.HostFitness", "num_workers", self.num_workers, 1, "it counts worker processes")
        else:
            object.__setattr__(self, "num_workers", available_cores())
        if self.timeout_s is not None:
            object.__setattr__(self, "timeout_s", validation.check_float(
                "es.HostFitness", "timeout_s", self.timeout_s, positive=True, example="60.0"))
        given = [name for name in ("init", "update", "stats") if getattr(self, name) is not None]
        if given and len(given) < 3:
            missing = [name for name in ("init", "update", "stats") if name not in given]
            raise TypeError(
                f"es.HostFitness({', '.join(f'{name}=...' for name in given)}): a stateful host fitness needs "
                f"init, update and stats together; also pass {', '.join(missing)}."
            )
        for name in ("init", "update"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise TypeError(f"es.HostFitness({name}=...): {name} must be callable.")
        _check_arity(self.fn, 3 if given else 2)
        if self.stats is not None:
            object.__setattr__(self, "stats", jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(np.shape(x), np.result_type(x)), self.stats))
        object.__setattr__(self, "_pool", _Pool(self))

    def __getstate__(self):  # a copy (e.g. inside a pickled task) carries the settings, not the running pool
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def __setstate__(self, fields):
        for name, value in fields.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_pool", _Pool(self))

    on_host: ClassVar[bool] = True  # the engine's adapter: evaluated in worker processes, not traced
    shared_by: ClassVar[str] = "member"  # each member its own seed (es.CommonRandomNumbers shares them)

    @property
    def stateful(self) -> bool:
        """Whether ``fn`` also returns per-member statistics (``init``/``update``/``stats`` given)."""
        return self.init is not None

    def close(self) -> None:
        """Stop the worker processes (a later evaluation starts them again)."""
        self._pool.stop()

    def __enter__(self) -> HostFitness:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------- the engine's adapter

    def initial_state(self) -> PyTree:
        """``init()`` for a stateful host fitness, else ``None`` (what ``strategy.init`` stores)."""
        return self.init() if self.stateful else None

    def update_state(self, fitness_state: PyTree, stats: PyTree) -> PyTree:
        """``update(fitness_state, stats)``: the state after a generation (stateful only)."""
        return self.update(fitness_state, stats)

    def check(self, params: PyTree, key: jax.Array, fitness_state: PyTree, popsize: int) -> None:
        """Checks before compiling: ``update`` must map the ``stats`` of ``popsize`` members, gathered, to a state
        like ``fitness_state``."""
        del params, key
        if not self.stateful:
            return
        gathered = jax.tree.map(lambda s: jax.ShapeDtypeStruct((popsize, *s.shape), s.dtype), self.stats)
        try:
            out = jax.eval_shape(self.update, fitness_state, gathered)
        except Exception as error:
            raise TypeError(
                f"es.HostFitness(update=...) failed on the fitness state and the stats (with a leading popsize "
                f"axis): {type(error).__name__}: {error}. update(fitness_state, stats) must be JAX code."
            ) from error
        difference = validation.tree_difference(out, jax.eval_shape(lambda: fitness_state))
        if difference is not None:
            raise TypeError(f"es.HostFitness(update=...) must return a state like init()'s: {difference}.")

    def default_eval_batch_size(self, popsize: int, antithetic: bool, dim: int) -> int:
        """The whole population: each device evaluates its whole share in one batch (``map_chunks`` clamps)."""
        del antithetic, dim
        return popsize

    def evaluate(self, members, chunk: jax.Array, fitness_state: PyTree, pairs: bool, shared_by: str = "member"):
        """Not traced: the engine evaluates an on-host fitness between compiled programs (``evaluate_host``)."""
        raise TypeError("es.HostFitness is evaluated on the host (es.engine.host_loop), not inside a traced program.")

    def evaluate_host(self, generation: int | None, members: np.ndarray, seeds: np.ndarray, params: PyTree,
                      fitness_state: PyTree):
        """``(fitness float64[n], stats, failure)``: the members ``members`` (their indices) of generation
        ``generation``, in one dispatch to the pool, in member order.

        ``params`` is a pytree of numpy arrays with a leading axis ``n``, ``seeds`` their uint32 seeds,
        ``fitness_state`` the state's as numpy (stateful only). ``failure`` says what went wrong, or is
        ``None``; after one every value is NaN. Ctrl-C (any exception while waiting) stops the workers first.
        """
        pool = self._pool
        pool.begin()
        try:
            values, stats = pool.evaluate(generation, members, seeds, params,
                                          fitness_state if self.stateful else None)
        except BaseException:
            pool.abort()
            raise
        return values, stats, pool.failure

    def evaluate_batch(self, params: PyTree, seeds=None, fitness_state: PyTree = None):
        """The fitnesses (float64[n]) of a batch of params, evaluated in the workers: for an ask/tell loop.

        ``params``: a pytree of arrays with a leading axis of ``n`` members (``es.ask``'s population);
        ``seeds``: ``n`` ints passed to ``fn`` (default ``0, 1, ..., n - 1``); ``fitness_state`` for a stateful
        fitness, whose ``(values, stats)`` are then returned. Raises ``FitnessError`` (the workers stopped) when
        an evaluation fails.
        """
        params = jax.tree.map(np.asarray, params)
        leaves = jax.tree.leaves(params)
        if not leaves or any(np.ndim(x) < 1 or np.shape(x)[0] != np.shape(leaves[0])[0] for x in leaves):
            raise ValueError("es.HostFitness.evaluate_batch(params=...): give a pytree of arrays with one leading "
                             "member axis, as es.ask returns it.")
        n = np.shape(leaves[0])[0]
        seeds = np.arange(n, dtype=np.uint32) if seeds is None else np.asarray(seeds, np.uint32).reshape(-1)
        if seeds.shape != (n,):
            raise ValueError(f"es.HostFitness.evaluate_batch(seeds=...): give {n} seeds, one per member; got "
                             f"{seeds.shape[0]}.")
        if self.stateful and fitness_state is None:
            raise ValueError("es.HostFitness.evaluate_batch: a stateful host fitness needs fitness_state=...")
        state = jax.tree.map(np.asarray, fitness_state) if self.stateful else None
        values, stats, failure = self.evaluate_host(None, np.arange(n), seeds, params, state)
        if failure:
            self.close()
            raise FitnessError(failure)
        return (values, stats) if self.stateful else values
