"""Fitness outside JAX: ``es.HostFitness`` evaluates members in a pool of worker processes.

    fitness = es.HostFitness(simulate, num_workers=None, timeout_s=60.0)   # simulate(params, seed) -> float
    state, metrics = es.evolve(strategy, fitness, state, 100, mesh=mesh)

Inside the compiled generation each device hands all its members to the host
at once (one ``jax.pure_callback`` per device and generation, the whole local
share in one batch), the host schedules one task per member on a
``pebble.ProcessPool`` and returns the fitnesses in member order::

    device d, generation g                         host (this process)
    ----------------------------                   -------------------------------------------
    members m_0 .. m_{k-1} (params, seeds)  --->   pool.schedule(fn, (params_i, seed_i)) x k
                                                   num_workers processes run them in parallel
    fitness f32[k] (+ stats)                <---   results in member order (NaN after a failure)

A member's fitness depends only on its params and its seed (an int drawn from
the member's evaluation key), never on which worker or device evaluated it, so
results do not depend on ``num_workers`` or on the device count. Under
``python -m es.launch`` each process evaluates its own devices' members in its
own pool; only the fitnesses cross processes, in the engine's all-gather.

Failures never hang and never leave processes behind. ``fn`` raising, a worker
dying (a segfault, ``os._exit``) or a member exceeding ``timeout_s`` is
recorded on the host, the remaining members of the generation are cancelled,
every later evaluation of the call returns NaN at once (the engine leaves the
distribution unchanged when no member is valid), and once the compiled call
has returned ``es.evolve`` stops the workers and raises ``FitnessError``
naming the generation, the member and the original error with its traceback.
In a multi-process run the processes agree on the outcome
(``es.distributed.all_processes``), so every process raises. Ctrl-C stops the
workers and raises ``KeyboardInterrupt``; inside ``es.run`` the first Ctrl-C
finishes the segment and checkpoints, as for any fitness.

Workers are started from a clean interpreter (the ``forkserver`` method where
available, else ``spawn``), never forked from this process and its JAX
threads; ``fn`` travels to them with ``cloudpickle``, so lambdas and closures
defined in a script or a notebook work, and a traceback from a worker still
quotes ``fn``'s source lines (``es.pickled_code``). As with any ``multiprocessing``
program, a script that creates the pool must keep its top-level code under
``if __name__ == "__main__":``.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import dataclasses
import itertools
import multiprocessing
import os
import signal
import threading
import time
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from es import validation
from es.parallel import distributed
from es.host import pickled_code
from es.engine import members as population
from es.fitness.contract import Fitnesses, fitness_dtype, from_host

PyTree = Any

POLL_S = 0.01  # how often the host checks a running call (Ctrl-C, another device's failure)
STOP_TIMEOUT_S = 10.0  # how long stopping the pool may wait for its workers to exit
WATCHDOG_S = 0.5  # how often a worker checks that the process it works for is still alive

# Numbers the evaluating calls of this process, so that every process of a multi-process run agrees on the
# outcome of the same call under the same name (they all make the same es.evolve calls in the same order).
_call_numbers = itertools.count()


class FitnessError(RuntimeError):
    """A host fitness evaluation failed: ``fn`` raised, its worker died, or it exceeded ``timeout_s``.

    Raised by ``es.evolve`` and ``es.run`` once the compiled call has returned
    (``es.run`` first checkpoints the segments that completed). The message
    names the generation, the member, its seed and, when ``fn`` raised, the
    original error with the worker's traceback. In a multi-process run it
    also names the process.
    """


def member_seed(key: jax.Array) -> jax.Array:
    """uint32 seed of the member whose evaluation key is ``key``: what ``HostFitness`` passes ``fn``.

    ``key`` is ``es.population.eval_key(generation_key, member)``, the key a
    JAX fitness would receive; ``np.random.default_rng(seed)`` then gives the
    member reproducible randomness.
    """
    return jax.random.bits(key, (), jnp.uint32)


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
        self, members: population.Generation, chunk: jax.Array, fitness_state: PyTree, pairs: bool,
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
        values = jax.ShapeDtypeStruct((n,), fitness_dtype())
        shapes = (
            Fitnesses(values, values),
            jax.tree.map(lambda s: jax.ShapeDtypeStruct((n, *s.shape), s.dtype), self.stats),
        )
        state = fitness_state if self.stateful else None
        with jax.named_scope("es_fitness"):
            fitness, stats = jax.pure_callback(
                self._pool.evaluate, shapes, members.generation, chunk, seeds, params, state
            )
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

        def run():
            try:
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


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)


class _Stopped(Exception):
    """This batch stops early: another batch failed, or the call was interrupted."""


class _Pool:
    """The host side of a ``HostFitness``: the worker pool and the failure of the call in progress.

    ``evaluate`` runs on XLA's threads (one call per device and generation);
    ``begin``/``abort``/``stop`` on the thread that called ``es.evolve``.
    """

    def __init__(self, settings: HostFitness):
        import cloudpickle

        fn, stateful = settings.fn, settings.stateful
        try:
            self.payload = cloudpickle.dumps((fn, stateful, pickled_code.source_files(fn)))
        except Exception as error:
            raise TypeError(
                f"es.HostFitness(fn={fn!r}): fn cannot be sent to worker processes: {type(error).__name__}: "
                f"{error}. Pass a function whose closure holds picklable values (numpy arrays, numbers, "
                "dataclasses), and create unpicklable resources (simulators, files) inside fn."
            ) from error
        self.stateful = stateful
        self.spec = settings.stats
        self.num_workers = settings.num_workers
        self.timeout_s = settings.timeout_s
        self.lock = threading.Lock()
        self.pool = None
        self.failure: str | None = None
        self.stopping = False

    def begin(self) -> None:
        """A new call: no failure yet, workers up."""
        with self.lock:
            self.failure = None
            self.stopping = False
            self._started()

    def _started(self):
        if self.pool is None:
            import pebble

            self.pool = pebble.ProcessPool(
                max_workers=self.num_workers, initializer=_start_worker, initargs=(self.payload, os.getpid()),
                context=_context(),
            )
        return self.pool

    def abort(self) -> None:
        """Every evaluation still running or to come returns NaN at once; the workers are stopped."""
        with self.lock:
            self.stopping = True
        self.stop()

    def stop(self) -> None:
        """Stop every worker process now and wait for them to exit, ``STOP_TIMEOUT_S`` at most.

        pebble's ``join`` ignores its timeout once the pool is stopped (it
        joins its manager threads, then terminates each worker with a 3 s
        grace), so it runs on a daemon thread and this waits for it with the
        bound. A worker it has not reached by then still exits when this
        process does (the watchdog of ``_start_worker``).
        """
        with self.lock:
            pool, self.pool = self.pool, None
        if pool is not None:
            pool.stop()
            joining = threading.Thread(target=pool.join, name="es.HostFitness stop", daemon=True)
            joining.start()
            joining.join(STOP_TIMEOUT_S)

    def fail(self, text: str) -> None:
        with self.lock:
            if self.failure is None:
                self.failure = text

    # ------------------------------------------------------- on XLA's threads

    def evaluate(self, generation, members, seeds, params, fitness_state):
        """The host callback: ``(Fitnesses, stats)`` of ``n`` members; NaN for all after a failure."""
        members, seeds = np.asarray(members), np.asarray(seeds)
        params, fitness_state = jax.tree.map(np.asarray, (params, fitness_state))  # (XLA passes jax Arrays)
        n = len(members)
        fitness = np.full((n,), np.nan, np.float64)
        stats = None
        futures = []
        try:
            with self.lock:
                if self.failure is not None or self.stopping:
                    raise _Stopped
                pool = self._started()
                for i in range(n):
                    member_params = jax.tree.map(lambda x: x[i], params)
                    futures.append(pool.schedule(
                        _run_member, args=(member_params, int(seeds[i]), fitness_state), timeout=self.timeout_s))
            results = self._collect(futures, int(generation), members, seeds)
            fitness, stats = self._unpack(results, int(generation), members, seeds)
        except _Stopped:
            pass
        except BaseException as error:  # never let an exception reach XLA (it would surface as INTERNAL)
            self.fail(f"es.HostFitness: evaluating generation {int(generation)} failed on the host: "
                      f"{type(error).__name__}: {error}")
        finally:
            for future in futures:
                future.cancel()  # running ones: pebble stops their worker
        if stats is None:
            stats = self._zero_stats(n)
        try:
            return from_host(fitness, f"es.HostFitness in generation {int(generation)}"), stats
        except ValueError as error:
            self.fail(str(error))
            return from_host(np.full((n,), np.nan), "es.HostFitness"), stats

    def _collect(self, futures, generation, members, seeds) -> list:
        pending = set(futures)
        while pending:
            done, pending = concurrent.futures.wait(pending, timeout=0.1, return_when=concurrent.futures.FIRST_EXCEPTION)
            for future in done:
                if not future.cancelled() and future.exception() is not None:
                    i = futures.index(future)
                    self.fail(_describe(future.exception(), generation, int(members[i]), int(seeds[i]),
                                        self.timeout_s))
            if self.failure is not None or self.stopping:
                raise _Stopped
        return [future.result() for future in futures]

    def _unpack(self, results, generation, members, seeds):
        fitness = np.empty((len(results),), np.float64)
        stats = []
        for i, result in enumerate(results):
            where = f"generation {generation}, member {int(members[i])} (seed {int(seeds[i])})"
            if self.stateful:
                if not (isinstance(result, tuple) and len(result) == 2):
                    self.fail(f"es.HostFitness: fn must return (fitness, stats) for a stateful host fitness; "
                              f"{where} returned {type(result).__name__}.")
                    raise _Stopped
                result, member_stats = result
                stats.append(member_stats)
            value = np.asarray(result)
            if value.shape != () or not (np.issubdtype(value.dtype, np.floating)
                                         or np.issubdtype(value.dtype, np.integer)):
                self.fail(f"es.HostFitness: fn must return one real number; {where} returned {result!r}.")
                raise _Stopped
            fitness[i] = value
        return fitness, (self._stack_stats(stats, generation, members) if self.stateful else None)

    def _stack_stats(self, stats, generation, members):
        spec = self.spec
        try:
            stacked = jax.tree.map(lambda s, *xs: np.stack([np.asarray(x, s.dtype) for x in xs]), spec, *stats)
        except Exception as error:
            self.fail(f"es.HostFitness: in generation {generation}, the stats fn returned do not match "
                      f"stats={spec}: {type(error).__name__}: {error}")
            raise _Stopped from None
        wrong = [(s.shape, x.shape[1:]) for s, x in zip(jax.tree.leaves(spec), jax.tree.leaves(stacked))
                 if x.shape[1:] != s.shape]
        if wrong:
            self.fail(f"es.HostFitness: in generation {generation}, fn returned stats of shapes "
                      f"{[w[1] for w in wrong]} where stats= declares {[w[0] for w in wrong]}.")
            raise _Stopped
        return stacked

    def _zero_stats(self, n):
        return jax.tree.map(lambda s: np.zeros((n, *s.shape), s.dtype), self.spec)


def _describe(error: BaseException, generation: int, member: int, seed: int, timeout_s) -> str:
    """What ``FitnessError`` says about one failed member."""
    import pebble

    where = f"generation {generation}, member {member} (seed {seed})"
    if isinstance(error, concurrent.futures.process.BrokenProcessPool):
        return (f"es.HostFitness: the worker processes could not start or all died ({error}) while evaluating "
                f"{where}; their stderr says why. A script must keep its top-level code under "
                "`if __name__ == \"__main__\":`, as for any multiprocessing program: workers import the main "
                "module, and would otherwise run the script again.")
    if isinstance(error, pebble.ProcessExpired):
        code = error.exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        return (f"es.HostFitness: the worker process evaluating {where} died ({how}). Its fn crashed the "
                "interpreter (a segfault in a simulator, os._exit, out of memory); the run is stopped.")
    remote = getattr(error, "traceback", None)
    if isinstance(error, TimeoutError) and remote is None:
        return (f"es.HostFitness: {where} exceeded timeout_s={timeout_s:g} s; its worker was stopped. Raise "
                "timeout_s, or make fn return sooner (e.g. cap the episode length).")
    text = f"es.HostFitness: fn raised in {where}: {type(error).__name__}: {error}"
    if remote:
        text += f"\n\nTraceback in the worker process:\n{remote.rstrip()}"
    return text


# ----------------------------------------------------------------- worker side


def _context():
    """Start workers from a clean process: forkserver where available, else spawn (never fork).

    The fork server (one per process, started with the first pool) imports
    this module once, so that a new worker starts in milliseconds rather than
    importing JAX again (workers import it to unpickle ``fn``'s module anyway).
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["__main__", __name__])
    return context


_WORKER_FN: tuple | None = None


def _start_worker(payload: bytes, parent: int) -> None:
    """Pool initializer: load ``fn``, and exit as soon as process ``parent`` (ours) is gone.

    Workers are children of the fork server, not of ``parent``, and would
    outlive a ``parent`` that is killed (SIGKILL, a crash) while they run a
    long ``fn``: a watchdog thread ends them within ``WATCHDOG_S``.
    """
    global _WORKER_FN
    import cloudpickle

    threading.Thread(target=_watch, args=(parent,), name="es.HostFitness watchdog", daemon=True).start()
    fn, stateful, files = cloudpickle.loads(payload)
    pickled_code.restore_source_files(fn, files)  # tracebacks quote fn's source lines again
    _WORKER_FN = fn, stateful


def _watch(parent: int) -> None:
    while True:
        time.sleep(WATCHDOG_S)
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:  # the pid was reused by another user's process: ours is gone
            os._exit(1)


def _run_member(params, seed, fitness_state):
    fn, stateful = _WORKER_FN
    return fn(params, seed, fitness_state) if stateful else fn(params, seed)
