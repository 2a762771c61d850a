"""The pool of worker processes behind ``es.HostFitness`` (``es/host/fitness.py``): scheduling, failures, workers.

    fitness = es.HostFitness(simulate, num_workers=None, timeout_s=60.0)   # simulate(params, seed) -> float
    state, metrics = es.evolve(strategy, fitness, state, 100, mesh=mesh)

Between two compiled programs of each generation (``es.engine.host_loop``) the host takes this process's
whole share of the population at once, schedules one task per member on a ``pebble.ProcessPool`` and
returns the fitnesses in member order::

    generation g                                   host (this process)
    ----------------------------                   -------------------------------------------
    members m_0 .. m_{k-1} (params, seeds)  --->   pool.schedule(fn, (params_i, seed_i)) x k
                                                   num_workers processes run them in parallel
    fitness float64[k] (+ stats)            <---   results in member order (NaN after a failure)

A member's fitness depends only on its params and its seed (an int drawn from
the member's evaluation key), never on which worker or device evaluated it, so
results do not depend on ``num_workers`` or on the device count. Under
``python -m es.launch`` each process evaluates its own devices' members in its
own pool; only the fitnesses cross processes, in the engine's all-gather.

Failures never hang and never leave processes behind. ``fn`` raising, a worker
dying (a segfault, ``os._exit``) or a member exceeding ``timeout_s`` is
recorded on the host, the remaining members of the generation are cancelled,
and ``es.evolve`` stops the workers and raises ``FitnessError`` naming the
generation, the member and the original error with its traceback. In a
multi-process run the processes agree on the outcome of every generation
(``es.distributed.all_processes``), so every process raises. The host waits
for the workers in short, interruptible steps: Ctrl-C stops the workers and
raises ``KeyboardInterrupt`` at once; inside ``es.run`` the first SIGINT or
SIGTERM finishes the generation in progress and checkpoints, the second
stops at once.

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
import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import jax
import numpy as np

from es import validation
from es.host import pickled_code

PyTree = Any

STOP_TIMEOUT_S = 10.0  # how long stopping the pool may wait for its workers to exit
WATCHDOG_S = 0.5  # how often a worker checks that the process it works for is still alive



def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)


class _Stopped(Exception):
    """This batch stops early: another batch failed, or the call was interrupted."""


class _Pool:
    """The host side of a ``HostFitness``: the worker pool and the failure of the evaluation in progress
    (``begin`` starts one, ``evaluate`` runs it, ``abort``/``stop`` end the workers), on the calling thread."""

    def __init__(self, settings):  # an es.HostFitness
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

    # ------------------------------------------------------- evaluating

    def evaluate(self, generation: int | None, members, seeds, params, fitness_state):
        """``(float64[n], stats)``: the fitnesses of ``n`` members in member order (their stacked stats, or
        ``None``), one task per member on the pool; NaN for all after a failure, which ``failure`` then says.

        ``params`` is a pytree of numpy arrays with a leading axis ``n``; ``generation`` names them in messages
        (``None``: a batch of no generation). Waits in short, interruptible steps: a signal's exception (Ctrl-C)
        propagates, and the caller aborts the pool.
        """
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
            results = self._collect(futures, generation, members, seeds)
            fitness, stats = self._unpack(results, generation, members, seeds)
        except _Stopped:
            pass
        except Exception as error:  # our own bookkeeping failed: a failure of the call, not a crash
            self.fail(f"es.HostFitness: evaluating members{_in(generation)} failed on the host: "
                      f"{type(error).__name__}: {error}")
        finally:
            for future in futures:
                future.cancel()  # running ones: pebble stops their worker
        if self.stateful and stats is None:
            stats = self._zero_stats(n)
        return fitness, stats

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
            where = _where(generation, int(members[i]), int(seeds[i]))
            if self.stateful:
                if not (isinstance(result, tuple) and len(result) == 2):
                    self.fail(f"es.HostFitness: fn must return (fitness, stats) for a stateful host fitness; "
                              f"{where} returned {type(result).__name__}.")
                    raise _Stopped
                result, member_stats = result
                stats.append(member_stats)
            value = np.asarray(result)
            if value.shape != () or not validation.real_dtype(value.dtype):
                self.fail(f"es.HostFitness: fn must return one real number; {where} returned {result!r}.")
                raise _Stopped
            fitness[i] = value
        return fitness, (self._stack_stats(stats, generation, members) if self.stateful else None)

    def _stack_stats(self, stats, generation, members):
        spec = self.spec
        try:
            stacked = jax.tree.map(lambda s, *xs: np.stack([np.asarray(x, s.dtype) for x in xs]), spec, *stats)
        except Exception as error:
            self.fail(f"es.HostFitness{_in(generation)}: the stats fn returned do not match "
                      f"stats={spec}: {type(error).__name__}: {error}")
            raise _Stopped from None
        wrong = [(s.shape, x.shape[1:]) for s, x in zip(jax.tree.leaves(spec), jax.tree.leaves(stacked))
                 if x.shape[1:] != s.shape]
        if wrong:
            self.fail(f"es.HostFitness{_in(generation)}: fn returned stats of shapes "
                      f"{[w[1] for w in wrong]} where stats= declares {[w[0] for w in wrong]}.")
            raise _Stopped
        return stacked

    def _zero_stats(self, n):
        return jax.tree.map(lambda s: np.zeros((n, *s.shape), s.dtype), self.spec)


def _where(generation: int | None, member: int, seed: int) -> str:
    """``"generation g, member m (seed s)"``, or without the generation for a batch of none."""
    return ("" if generation is None else f"generation {generation}, ") + f"member {member} (seed {seed})"


def _in(generation: int | None) -> str:
    """``" in generation g"``, or nothing for a batch of no generation."""
    return "" if generation is None else f" in generation {generation}"


def _describe(error: BaseException, generation: int | None, member: int, seed: int, timeout_s) -> str:
    """What ``FitnessError`` says about one failed member."""
    import pebble

    where = _where(generation, member, seed)
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
