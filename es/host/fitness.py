"""``es.HostFitness``: a fitness that is not JAX, evaluated in a pool of worker processes (``es/host/pool.py``).

    fitness = es.HostFitness(simulate, num_workers=None, timeout_s=60.0)   # simulate(params, seed) -> float
    state, metrics = es.evolve(strategy, fitness, state, 100, mesh=mesh)

It implements the engine's ``es.fitness.Fitness`` contract itself: inside the compiled generation each
device hands all its members to the host at once (one ``jax.pure_callback`` per device and generation),
and the pool returns their fitnesses in member order, at float64's precision (``es.fitness.from_host``).
The pool's module docstring says how failures, timeouts and Ctrl-C end a call.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, ClassVar

import jax
import numpy as np

from es import validation
from es.fitness.contract import Fitnesses, fitness_dtype
from es.host.pool import POLL_S, FitnessError, _call_numbers, _Pool, available_cores, member_seed
from es.parallel import distributed

PyTree = Any


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

    def check(self, params: PyTree, key: jax.Array, fitness_state: PyTree) -> None:
        """Checks before compiling: ``update`` must map the gathered ``stats`` to a state like ``fitness_state``."""
        del params, key
        if not self.stateful:
            return
        gathered = jax.tree.map(lambda s: jax.ShapeDtypeStruct((2, *s.shape), s.dtype), self.stats)
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

    def evaluate(
        self, members, chunk: jax.Array, fitness_state: PyTree, pairs: bool,
        shared_by: str = "member",
    ):
        """``(Fitnesses, stats)`` of the members ``chunk``, by one host callback.

        ``fn``'s values keep float64's precision: the callback returns them
        rounded to the fitness dtype and the residual (``es.fitness.from_host``).

        Members are built one by one (``pairs`` ignored): whether a device's
        share holds whole antithetic pairs depends on the mesh, and building a
        pair from one draw may round ``scale * eps`` differently, so this keeps
        every member's params, and so its fitness, the same on any mesh. (The
        extra noise draws cost nothing next to a host evaluation.)
        """
        del pairs
        params = members.members(chunk, False)
        keys = members.eval_keys(chunk, shared_by)
        seeds = jax.vmap(member_seed)(keys)
        n = chunk.shape[0]
        pair = jax.ShapeDtypeStruct((n,), np.float32)  # a float64 value as float32 + float32 (48 bits)
        shapes = (
            Fitnesses(pair, pair),
            jax.tree.map(lambda s: jax.ShapeDtypeStruct((n, *s.shape), s.dtype), self.stats),
        )
        state = fitness_state if self.stateful else None
        with jax.named_scope("es_fitness"):
            # float32 whatever the x64 setting: XLA's callback threads do not see a jax.enable_x64 context.
            fitness, stats = jax.pure_callback(
                self._pool.evaluate, shapes, members.generation, chunk, seeds, params, state)
        if fitness_dtype() == np.float64:
            exact = fitness.value.astype(np.float64) + fitness.residual.astype(np.float64)
            fitness = Fitnesses(exact, jax.numpy.zeros_like(exact))
        return fitness, (stats if self.stateful else ())

    def dispatch(self, call: Callable[[], Any], state: Any) -> Any:
        """Run ``call()`` (a compiled ``es.evolve`` from ``state``) and raise ``FitnessError`` on any failure.

        XLA runs a computation with host callbacks synchronously, so the call
        runs on a helper thread while this one waits in short, interruptible
        steps. Ctrl-C while waiting: every evaluation left returns NaN at
        once, the workers are stopped, the computation is let finish (quickly;
        a second Ctrl-C does not wait) and ``KeyboardInterrupt`` propagates.
        """
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(state)):
            raise TypeError(
                "es.evolve with an es.HostFitness cannot be traced (called under jax.jit, vmap or grad): its "
                "failures are raised on the host once the computation has run. Call es.evolve directly."
            )
        pool = self._pool
        pool.begin()
        outcome = {}

        x64 = fitness_dtype() == np.float64  # a jax.enable_x64 context holds for this thread only

        def run():
            try:
                with jax.enable_x64(x64):
                    outcome["out"] = jax.block_until_ready(call())
            except BaseException as error:  # handed to the waiting thread
                outcome["error"] = error

        thread = threading.Thread(target=run, name="es.HostFitness", daemon=True)
        thread.start()
        try:
            while thread.is_alive():
                thread.join(POLL_S)
        except BaseException:  # Ctrl-C (or a signal handler's exception): stop evaluating, stop the workers
            pool.abort()
            thread.join()
            raise
        if "error" in outcome:
            pool.abort()
            raise outcome["error"]
        failure = pool.failure
        if distributed.process_count() > 1:
            outcomes = distributed.all_processes(f"es.HostFitness/{next(_call_numbers)}", failure or "")
            failed = [(p, text) for p, text in enumerate(outcomes) if text]
            if failed:
                process, text = failed[0]
                failure = f"process {process}: {text}"
        if failure:
            pool.stop()
            raise FitnessError(failure)
        return outcome["out"]
