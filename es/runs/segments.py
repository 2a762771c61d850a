"""The segment loop of ``es.run`` and ``es.run_many``, and what it hands back: ``Segment`` and ``RunResult``.

The loop calls ``es.evolve`` (or ``es.evolve_many``) for ``segment``
generations at a time and after each segment appends the metrics to every
run's ``metrics.jsonl``, starts its checkpoint, advances the progress bar and
calls ``on_segment``. A JAX fitness's segment ``k + 1`` runs on a helper
thread while the host logs and checkpoints segment ``k``; a fitness on the
host (``es.HostFitness``) runs its generations on this thread, one at a time,
and its segment ends early after the generation in progress when a stop is
requested. Either way this thread waits in short, interruptible steps, so a
signal acts however long a segment or an evaluation takes.
"""

from __future__ import annotations

import atexit
import collections
import os
import pathlib
import signal
import sys
import threading
import time
from typing import Any, Callable, NamedTuple

import jax

import numpy as np

from es.parallel.distributed import is_writer
from es.runs.checkpoint import CheckpointError, Checkpointer
from es.runs.host_arrays import to_numpy
from es.runs.metrics_log import MetricsLog
from es.runs.options import RunOptions
from es.runs.params_file import save_params
from es.runs.signals import Stopper
from es.strategies.base import State

LOG_NAME = "metrics.jsonl"
CHECKPOINTS_NAME = "checkpoints"
PARAMS_NAME = "params.npz"
CORRUPT_NAME = "corrupt_checkpoints"
TIME_NAME = "time_s"


class RunResult(NamedTuple):
    """What ``es.run`` returns.

    Attributes:
      state: the final ``es.State``.
      metrics: metric name -> numpy array with one entry per generation of
        the whole run (resumed parts included), as ``es.evolve`` returns them.
      time_s: float64 ``[generations]``, wall-clock seconds of the run when
        each generation's segment finished.
      stopped_by: the signal number (``signal.SIGTERM``/``SIGINT``) that
        stopped the run early, or ``None`` when it ran all its generations.
    """

    state: State
    metrics: dict[str, np.ndarray]
    time_s: np.ndarray
    stopped_by: int | None = None

    @property
    def completed(self) -> bool:
        return self.stopped_by is None


def segment_lengths(start: int, stop: int, segment: int) -> list[int]:
    """Lengths of the segments from generation ``start`` to ``stop``, ending on multiples of ``segment``.

    Every segment has ``segment`` generations except possibly the last (when
    ``stop`` is not a multiple) and the first (when ``start`` is not, after a
    resume with another segment length); those run the segment's program too,
    their length a run-time value (``es.engine.evolution.Generations``).
    """
    lengths = []
    generation = start
    while generation < stop:
        length = min(segment - generation % segment, stop - generation)
        lengths.append(length)
        generation += length
    return lengths


class Segment(NamedTuple):
    """What ``es.run`` hands its ``on_segment`` callback after each segment.

    Attributes:
      start, stop: the segment's generations ``[start, stop)``.
      state: the state after generation ``stop`` (replicated on the mesh).
      metrics: metric name -> numpy array ``[stop - start]``, this segment's.
      time_s: wall-clock seconds of the run so far (resumed parts included).
    """

    start: int
    stop: int
    state: State
    metrics: dict[str, np.ndarray]
    time_s: float


class Driver(NamedTuple):
    """How the segment loop drives the run(s).

    ``advance(state, n, stop)`` runs ``n`` generations and returns ``(state,
    metrics)``: ``es.evolve``'s, or ``es.evolve_many``'s lists; ``stop()`` says
    whether to return after the generation in progress (read where ``on_host``).
    ``join(states)`` makes ``advance``'s state from every run's;
    ``states_of(state)`` and ``metrics_of(metrics)`` give every run's back.
    ``on_host``: the fitness is evaluated on the host, generation by generation.
    """

    advance: Callable
    join: Callable
    states_of: Callable
    metrics_of: Callable
    on_host: bool = False


class _Pending:
    """A segment in progress: on a daemon thread (a JAX fitness: the host logs meanwhile), or already run on
    this one (``ran``, a fitness on the host). ``result()`` waits in short steps, so that a signal's handler
    runs, and raises what the segment raised."""

    POLL_S = 0.05

    def __init__(self, run: Callable[[], Any], background: bool):
        self.value, self.error, self.thread, self.done = None, None, None, None
        if not background:
            self.value = run()
            return
        x64 = bool(jax.config.jax_enable_x64)  # a jax.enable_x64 context holds for its own thread only

        self.done = threading.Event()  # (the interpreter's exit may call an unfinished daemon thread dead)

        def target():
            try:
                with jax.enable_x64(x64):
                    self.value = jax.block_until_ready(run())
            except BaseException as error:  # handed to the waiting thread
                self.error = error
            finally:
                self.done.set()

        self.thread = threading.Thread(target=target, name="es.run segment", daemon=True)
        self.thread.start()

    def result(self):
        try:
            while self.thread is not None and self.thread.is_alive():
                self.thread.join(self.POLL_S)
        except BaseException as stopped:  # a second signal's KeyboardInterrupt or SystemExit, while XLA runs on
            atexit.register(_exit_unless_done, self.done, _exit_status(stopped))
            raise
        if self.error is not None:
            raise self.error
        return self.value


def _exit_status(stopped: BaseException) -> int:
    """The status a process stopped by ``stopped`` exits with: 130 for Ctrl-C, a ``SystemExit``'s own code."""
    if isinstance(stopped, SystemExit):
        return stopped.code if isinstance(stopped.code, int) else 1
    return 128 + int(signal.SIGINT) if isinstance(stopped, KeyboardInterrupt) else 1


def _exit_unless_done(done: threading.Event, status: int) -> None:
    """At the interpreter's exit, with a segment's thread still inside XLA (no call can stop a compiled loop):
    the interpreter's finalisation would abort the process under it (SIGABRT, with C++'s "terminate called"), so
    the process ends here with ``status`` (its output flushed; the last complete checkpoint stays)."""
    if not done.is_set():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


class RunDir:
    """One run of the segment loop: its directory and identity, and what it opened (writers: log, checkpoints)."""

    def __init__(self, run_dir, identity):
        self.run_dir = None if run_dir is None else pathlib.Path(run_dir)
        self.identity = identity
        self.checkpointer: Checkpointer | None = None
        self.log: MetricsLog | None = None
        self.initial_digest: str | None = None
        self.history: dict = {}


def run_segments(segments: Driver, runs: list[RunDir], states: list[State], options: RunOptions, start: int,
                 run_name: str, on_segment: Callable | None) -> list[RunResult]:
    """The segment loop of ``run`` and ``run_many``: ``segments.advance(state, n)`` runs ``n`` generations.

    ``runs[i].log`` and ``.checkpointer`` write only on the writing process (``None`` elsewhere, or without
    a run directory).
    """
    from tqdm.auto import tqdm

    num_generations = options.num_generations
    buffers: list[dict[str, np.ndarray]] = [{} for _ in runs]
    time_offset = float(runs[0].history[TIME_NAME][-1]) if start else 0.0
    bar = tqdm(total=num_generations, initial=start, unit="gen", desc=options.description,
               disable=not (options.progress and is_writer()), file=sys.stderr, dynamic_ncols=True, smoothing=0.3)
    stopper = Stopper(options.handle_signals, verbose=is_writer(), run_name=run_name,
                      unit="generation" if segments.on_host else "segment")
    lengths = collections.deque(segment_lengths(start, num_generations, options.segment))
    generation = start
    stop_signal = None
    writes = is_writer() and runs[0].run_dir is not None
    state = segments.join(states)
    clock = time.perf_counter()

    def launch(state, length: int) -> _Pending:
        stop = lambda: stopper.signum is not None  # noqa: E731  (read between a host fitness's generations)
        return _Pending(lambda: segments.advance(state, length, stop), background=not segments.on_host)

    def next_segment(state) -> _Pending | None:
        nonlocal stop_signal
        if not lengths:
            return None
        stop_signal = stopper.agreed(generation)
        return None if stop_signal is not None else launch(state, lengths.popleft())

    try:
        if lengths:
            bar.set_postfix_str("compiling", refresh=True)
        in_flight = launch(state, lengths.popleft()) if lengths else None
        while in_flight is not None:
            segment_state, segment_metrics = in_flight.result()  # the segment's error, once the previous is logged
            in_flight = None
            if not segments.on_host:  # the next segment runs while this one is logged and checkpointed
                in_flight = next_segment(segment_state)
            elapsed = time_offset + time.perf_counter() - clock
            if writes and len(runs) > 1:  # every run's previous checkpoint on disk before any starts the next
                for each in runs:
                    each.checkpointer.wait()
            done_segments = []
            for index, (each, (run_state, run_metrics)) in enumerate(
                zip(runs, zip(segments.states_of(segment_state), segments.metrics_of(segment_metrics)))
            ):
                metrics = {name: to_numpy(values) for name, values in run_metrics.items()}
                length = len(next(iter(metrics.values())))
                metrics[TIME_NAME] = np.full((length,), elapsed, np.float64)
                if not buffers[index]:
                    buffers[index] = _history_buffers(each.history, metrics, start, num_generations)
                for name, values in metrics.items():
                    buffers[index][name][generation:generation + length] = values
                stop = generation + length
                done = {name: values[:stop] for name, values in buffers[index].items()}
                if each.log is not None:
                    each.log.append(done, generation, stop)
                if each.checkpointer is not None:
                    each.checkpointer.save(run_state, done, each.identity, each.initial_digest)
                del metrics[TIME_NAME]
                done_segments.append(Segment(generation, stop, run_state, metrics, elapsed))
            bar.set_postfix_str(_progress_text(done_segments), refresh=False)
            bar.update(length)
            if on_segment is not None:
                on_segment(done_segments)
            generation, state = stop, segment_state
            if segments.on_host:  # run on this thread: the next one only once this one is logged
                in_flight = next_segment(segment_state)
    finally:
        stopper.restore()
        bar.close()
    stopped = stop_signal if generation < num_generations else None
    results = []
    for index, (each, run_state) in enumerate(zip(runs, segments.states_of(state))):
        if stopped is None and writes:
            each.checkpointer.wait()  # params.npz says the run is complete: only once its last checkpoint is
            save_params(each.run_dir / PARAMS_NAME, run_state.params, run_state.best_params)
        done = {name: values[:generation] for name, values in (buffers[index] or each.history).items()}
        time_s = done.pop(TIME_NAME, np.zeros((0,), np.float64))
        results.append(RunResult(run_state, done, time_s, stopped))
    return results


def _progress_text(segments: list[Segment]) -> str:
    """The progress bar's postfix: the last generation's best and mean fitness (their range over the runs)."""
    best = [float(s.metrics["best_fitness"][-1]) for s in segments]
    mean = [float(s.metrics["fitness_mean"][-1]) for s in segments]
    if len(segments) == 1:
        return f"best {best[0]:.5g}, mean {mean[0]:.5g}"
    return f"{len(segments)} runs: best {min(best):.4g}..{max(best):.4g}, mean {min(mean):.4g}..{max(mean):.4g}"


def _history_buffers(history, metrics, start, num_generations) -> dict[str, np.ndarray]:
    """Arrays of ``num_generations`` entries per metric, the restored history in front."""
    buffers = {}
    for name, values in metrics.items():
        buffer = np.zeros((num_generations,), values.dtype)
        if start:
            if name not in history:
                raise CheckpointError(f"the checkpoint's history lacks the metric {name!r} that evolve returns.")
            buffer[:start] = history[name]
        buffers[name] = buffer
    return buffers
