"""``es.run``: a long experiment in segments that users can watch, stop and resume.

    result = es.run(strategy, fitness_fn, state, 1000, run_dir="runs/x", segment=50)

The run calls ``es.evolve`` for ``segment`` generations at a time (one
compiled function, reused) and after each segment

- updates a progress bar (generation, best and mean fitness, generations/s);
- appends the segment's per-generation metrics to ``<run_dir>/metrics.jsonl``;
- writes a checkpoint to ``<run_dir>/checkpoints/<generation>/`` (orbax,
  asynchronous and atomic, the last ``keep_checkpoints`` kept).

Segments are pipelined: segment ``k + 1`` is dispatched before the host logs
and checkpoints segment ``k``, so host work overlaps device work wherever
dispatch is asynchronous (GPU, TPU, a single CPU device).

SIGTERM or SIGINT finish the segment in progress, checkpoint it and return a
``RunResult`` with ``stopped_by`` set (a second signal stops at once; the last
checkpoint stays valid). ``resume=True`` continues from the latest checkpoint
and ends bit-identical to a run that was never interrupted, whenever the
first one was killed.

Only process 0 writes anything (``is_writer``); every process computes. In a
multi-process run every process reads the checkpoint it resumes from, the
processes check that they resume from the same one, and they agree (through
JAX's coordination service, host-side) at every segment boundary whether to
stop, so a signal to any of them stops all of them after the same segment.
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import os
import pathlib
import signal
import sys
import threading
import time
import warnings
from typing import Any, Callable, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh

from es import distributed
from es.checkpoint import (
    CheckpointError, Checkpointer, CheckpointWarning, CorruptCheckpointError, describe_difference, save_params,
    state_digest, to_numpy,
)
from es.distributed import is_writer
from es.engine import check_evolve_args, evolve
from es.fitness import adapter
from es.metrics_log import MetricsLog
from es.strategy import State, Strategy
from es.validation import is_int

LOG_NAME = "metrics.jsonl"
CHECKPOINTS_NAME = "checkpoints"
PARAMS_NAME = "params.npz"
CORRUPT_NAME = "corrupt_checkpoints"
TIME_NAME = "time_s"

# Numbers the es.run calls of this process, so that every call agrees with the other processes under its own
# names (every process makes the same es.run calls in the same order, as for es.evolve).
_run_numbers = itertools.count()


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
    resume with another segment length): at most two more compilations,
    each made while the previous segment runs.
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


def run(
    strategy: Strategy,
    fitness_fn: Callable,
    state: State,
    num_generations: int,
    *,
    run_dir: str | os.PathLike | None = None,
    segment: int = 50,
    keep_checkpoints: int = 3,
    config: Any = None,
    resume: bool = False,
    mesh: Mesh | None = None,
    exchange: str = "fitness",
    eval_batch_size: int | None = None,
    update_batch_size: int | None = None,
    on_segment: Callable[[Segment], None] | None = None,
    progress: bool = True,
    description: str = "es",
    handle_signals: bool = True,
) -> RunResult:
    """Run ``strategy`` until ``num_generations`` generations, in segments.

    Args:
      strategy: as for ``es.evolve``.
      fitness_fn: as for ``es.evolve``.
      state: the state the run starts from (``strategy.init(...)``). When
        resuming it must be the same initial state: it gives the structure
        the checkpoint is restored into, and its digest is checked against
        the one the run started from.
      num_generations: total generations of the run (counting from the
        initial state, not from the checkpoint).
      run_dir: directory for ``metrics.jsonl``, ``checkpoints/`` and, once
        complete, ``params.npz`` (params and best_params). ``None``: nothing
        is written.
      segment: generations per compiled ``es.evolve`` call; the log and the
        progress bar advance and a checkpoint is written after each.
      keep_checkpoints: how many of the latest checkpoints to keep.
      config: JSON-serialisable description of what determines the run's
        results beyond what ``es.run`` sees itself (the task, how the params
        were made, the seed). Stored in every checkpoint with the strategy's
        ``describe()`` and the execution's identity; a resume where any of
        them differs is refused.
      resume: continue from the latest intact checkpoint in ``run_dir`` (a
        fresh start if there is none). A corrupt or incomplete newest
        checkpoint is moved to ``run_dir/corrupt_checkpoints/`` with a
        ``CheckpointWarning`` naming both, and the run resumes from the one
        before. Without ``resume``, a ``run_dir`` that already holds
        checkpoints or log lines is refused rather than overwritten.
      mesh, exchange, eval_batch_size, update_batch_size: as for
        ``es.evolve``. A resume may change the mesh (except with
        ``exchange="gradient"``, whose rounding depends on it) but not the
        batch sizes, which fix the summation order.
      on_segment: called as ``on_segment(segment)`` with an ``es.Segment``
        after each segment is logged and checkpointed, on every process (use
        ``es.is_writer()`` to write from one): your own logging, evaluation
        or dashboard. An exception it raises ends the run; the checkpoint of
        that segment stays.
      progress: show a tqdm progress bar on stderr (process 0 only).
      description: the progress bar's label.
      handle_signals: on SIGTERM/SIGINT finish the segment, checkpoint and
        return (only from the main thread). In a multi-process run a signal
        to any process stops every process after the same segment.

    What a resume may change: ``num_generations``, ``segment``,
    ``keep_checkpoints``, the mesh (see above), ``on_segment``, ``progress``,
    ``description`` and ``handle_signals``; everything else is part of the
    run's identity.

    Returns:
      A ``RunResult``. Raises ``CheckpointError`` (a ``ValueError``) when no
      intact checkpoint can be resumed or it belongs to another run. An error
      of a segment (such as ``es.FitnessError`` from an ``es.HostFitness``) is
      raised once the segments before it are logged and checkpointed, so
      ``resume=True`` continues from there. The workers of an
      ``es.HostFitness`` are stopped when the run returns or raises.
    """
    _check_run_args(num_generations, run_dir, segment, keep_checkpoints, config, resume, on_segment)
    mesh, execution = check_evolve_args(
        strategy, fitness_fn, state, num_generations, mesh, exchange, eval_batch_size, update_batch_size
    )
    advance = functools.partial(
        evolve, strategy, fitness_fn, mesh=mesh, exchange=exchange,
        eval_batch_size=execution.eval_batch_size, update_batch_size=execution.update_batch_size,
    )
    identity = json.loads(json.dumps(
        {"config": config, "strategy": strategy.describe(), "execution": execution.identity(mesh.size)}
    ))
    writer = is_writer()
    name = f"es.run/{next(_run_numbers)}"
    initial_digest = None
    start, history = 0, {}
    checkpointer = log = None
    try:
        if run_dir is not None:
            run_dir = pathlib.Path(run_dir)
            directory = run_dir / CHECKPOINTS_NAME
            initial_digest = state_digest(state)
            # Process 0 opens the checkpoints first (removing what a killed write left behind); then every
            # process reads them, and they check that they all resume from the same one. Each step ends in an
            # exchange of its outcome, so that an error on any process stops every process there.
            outcome = ""
            try:
                if writer:
                    checkpointer = Checkpointer(directory, keep_checkpoints, writer=True)
            except Exception as error:  # any error: every process must reach the exchange
                outcome = error
            _agree_on(f"{name}/opened", run_dir, outcome)
            try:
                if not writer:
                    checkpointer = Checkpointer(directory, keep_checkpoints, writer=False)
                point = _resume_point(checkpointer, run_dir, state, identity, initial_digest, resume, num_generations)
                digest = initial_digest if point.state is state else state_digest(point.state)
                outcome = f"{point.generation} {digest}"
            except Exception as error:  # CheckpointError and any other: every process must reach the exchange
                outcome = error
            _check_same_resume_point(_agree_on(f"{name}/resume", run_dir, outcome), run_dir)
            start, state, history = point.generation, point.state, point.history
            if writer:
                for generation in point.corrupt:  # newer than the resume point: out of the way of new saves
                    checkpointer.quarantine(generation, run_dir / CORRUPT_NAME)
                log = MetricsLog(run_dir / LOG_NAME)
                log.rewrite(history, start)  # exactly the checkpointed generations, nothing after
        result = _run_segments(
            advance, state, num_generations, segment, start, history, checkpointer, log, identity,
            initial_digest, writer and progress, description, handle_signals, run_dir if writer else None,
            name, on_segment,
        )
    finally:
        adapter(fitness_fn).close()  # an es.HostFitness stops its workers
        if checkpointer is not None:
            checkpointer.close()  # process 0: the last checkpoint is on disk
    if run_dir is not None:  # and every process returns only once it is (a resume may follow at once)
        distributed.all_processes(f"{name}/closed")
    return result


def _check_run_args(num_generations, run_dir, segment, keep_checkpoints, config, resume, on_segment) -> None:
    for name, value, low in (("num_generations", num_generations, 0), ("segment", segment, 1),
                             ("keep_checkpoints", keep_checkpoints, 1)):
        if not is_int(value):
            raise TypeError(f"es.run({name}={value!r}): {name} must be an int.")
        if value < low:
            raise ValueError(f"es.run({name}={value}): {name} must be >= {low}.")
    if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):
        raise TypeError(f"es.run(run_dir={run_dir!r}): run_dir must be a path or None.")
    if not isinstance(resume, bool):
        raise TypeError(f"es.run(resume={resume!r}): resume must be True or False.")
    if on_segment is not None and not callable(on_segment):
        raise TypeError(f"es.run(on_segment={on_segment!r}): on_segment must be a callable on_segment(segment) or None.")
    try:
        json.dumps(config, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"es.run(config=...): config must be JSON-serialisable (dicts with str keys, lists, "
            f"str, finite numbers, bools, None): {error}."
        ) from None


def _agree_on(name: str, run_dir, outcome: str | Exception) -> list[str]:
    """Every process's ``outcome`` of one step (a short string, or the error it raised), in process order.

    One exchange of short strings. A process whose step failed re-raises its own error after the exchange;
    the others raise a ``CheckpointError`` naming it, so that no process waits for another that will never
    come.
    """
    failed_here = isinstance(outcome, Exception)
    everyone = distributed.all_processes(
        name, f"error {type(outcome).__name__}: {outcome}" if failed_here else f"ok {outcome}"
    )
    if failed_here:
        raise outcome
    failed = [(p, text) for p, text in enumerate(everyone) if text.startswith("error")]
    if failed:
        process, text = failed[0]
        raise CheckpointError(f"process {process} cannot start the run in {run_dir}: {text[len('error '):]}")
    return [text[len("ok "):] for text in everyone]


def _check_same_resume_point(everyone: list[str], run_dir) -> None:
    """Refuse resume points (``"<generation> <state digest>"`` per process) that differ between processes."""
    generations = [int(text.split()[0]) for text in everyone]
    if len(set(generations)) > 1:
        raise CheckpointError(
            f"the processes would start {run_dir} from different generations ({generations}, in process "
            "order): they do not see the same checkpoints. Every process reads the checkpoint it resumes "
            "from, so put the run directory on a filesystem they all share."
        )
    differ = [p for p, text in enumerate(everyone) if text != everyone[0]]
    if differ:
        raise CheckpointError(
            f"processes {differ} would start {run_dir} at generation {generations[0]} from another state "
            "than process 0: every process must pass the same initial state (same seed and params)."
        )


class _ResumePoint(NamedTuple):
    generation: int
    state: State
    history: dict
    corrupt: tuple[int, ...] = ()  # newer checkpoints skipped as corrupt


def _resume_point(checkpointer, run_dir, state, identity, initial_digest, resume, num_generations) -> _ResumePoint:
    """Where to start: the latest intact checkpoint (falling back past corrupt ones), or the beginning."""
    generations = checkpointer.generations()
    if not resume:
        log_path = run_dir / LOG_NAME
        if generations or (log_path.is_file() and log_path.stat().st_size):
            what = f"checkpoints up to generation {generations[-1]}" if generations else f"a non-empty {LOG_NAME}"
            raise ValueError(
                f"run_dir {run_dir} already holds {what}. Pass resume=True (CLI: --resume {run_dir}) "
                "to continue that run, or choose a new run_dir."
            )
        return _ResumePoint(0, state, {})
    corrupt = []
    for generation in reversed(generations):
        try:
            checkpoint = checkpointer.restore(generation, like=state)
        except CorruptCheckpointError as error:
            corrupt.append((generation, error))
            continue
        if corrupt:
            newest, reason = corrupt[0]
            warnings.warn(
                f"{reason}. Resuming from the previous intact checkpoint, {checkpoint.path} (generation "
                f"{checkpoint.generation}); the corrupt one ({checkpointer.directory / str(newest)}) is moved to "
                f"{run_dir / CORRUPT_NAME}.",
                CheckpointWarning,
                stacklevel=3,
            )
        break
    else:
        if corrupt:
            raise CheckpointError(
                f"no intact checkpoint in {checkpointer.directory}: {'; '.join(str(e) for _, e in corrupt)}. "
                "Start a new run (or move the run directory away)."
            )
        return _ResumePoint(0, state, {})
    if checkpoint.config != identity:
        raise CheckpointError(
            f"checkpoint {checkpoint.path} was made by another run: "
            f"{describe_difference(checkpoint.config, identity)}. Resume with the config, strategy and batch "
            "sizes the run was started with, or start a new run."
        )
    if checkpoint.initial_digest != initial_digest:
        raise CheckpointError(
            f"checkpoint {checkpoint.path} belongs to a run that started from another initial state "
            "(another seed or other initial params); pass the state the run was started with."
        )
    if checkpoint.generation > num_generations:
        raise CheckpointError(
            f"the run in {run_dir} has already done {checkpoint.generation} generations, more than "
            f"num_generations={num_generations}; ask for at least {checkpoint.generation}."
        )
    return _ResumePoint(checkpoint.generation, checkpoint.state, checkpoint.history, tuple(g for g, _ in corrupt))


class _Stopper:
    """Turns the first SIGTERM/SIGINT into a request to stop after the segment in progress.

    In a multi-process run the processes agree at every segment boundary
    (``agreed``): a signal to any one of them stops them all at the same boundary.
    """

    def __init__(self, enabled: bool, verbose: bool, run_name: str):
        self.signum: int | None = None
        self._verbose = verbose
        self._name = run_name
        self._previous = {}
        if enabled and threading.current_thread() is threading.main_thread():
            for signum in distributed.STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
            distributed.mark_launch("stoppable")  # es.launch: this rank stops cleanly on a signal

    def _handle(self, signum, frame):
        if self.signum is not None:  # the second signal: stop now, the last checkpoint stays valid
            self.restore()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        self.signum = signum
        if self._verbose:  # a raw write: no lock a progress bar or print may hold at this moment
            self._say(f"received {signal.Signals(signum).name}")

    def _say(self, what: str) -> None:
        os.write(2, (f"\n{what}: finishing the segment in progress, then checkpointing and stopping "
                     "(send it again to stop at once)\n").encode())

    def agreed(self, generation: int) -> int | None:
        """The signal that stops the run after the segment from ``generation``, or None; the same on every process."""
        if distributed.process_count() == 1:
            return self.signum
        requests = distributed.all_processes(f"{self._name}/stop/{generation}", str(self.signum or 0))
        signals = [int(request) for request in requests]
        stopping = [(p, s) for p, s in enumerate(signals) if s]
        if not stopping:
            return None
        process, signum = stopping[0]
        if self.signum is None and self._verbose:
            self._say(f"process {process} received {signal.Signals(signum).name}")
        return signum

    def restore(self):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}


def _run_segments(advance, state, num_generations, segment, start, history, checkpointer, log, identity,
                  initial_digest, show_progress, description, handle_signals, params_dir, run_name, on_segment):
    """The segment loop of ``run``: ``advance(state, n)`` runs ``n`` generations (an ``es.evolve``).

    ``log`` and ``params_dir`` are ``None`` on processes that do not write.
    """
    from tqdm.auto import tqdm

    buffers: dict[str, np.ndarray] = {}
    time_offset = float(history[TIME_NAME][-1]) if start else 0.0
    bar = tqdm(total=num_generations, initial=start, unit="gen", desc=description, disable=not show_progress,
               file=sys.stderr, dynamic_ncols=True, smoothing=0.3)
    stopper = _Stopper(handle_signals, verbose=is_writer(), run_name=run_name)
    lengths = collections.deque(segment_lengths(start, num_generations, segment))
    generation = start
    stop_signal = failure = None
    clock = time.perf_counter()
    try:
        if lengths:
            bar.set_postfix_str("compiling", refresh=True)
        in_flight = advance(state, lengths.popleft()) if lengths else None
        while in_flight is not None:
            segment_state, segment_metrics = in_flight
            in_flight = None
            if lengths:  # dispatch the next segment before waiting for this one, unless stopping
                stop_signal = stopper.agreed(generation)
                if stop_signal is None:
                    try:
                        in_flight = advance(segment_state, lengths.popleft())
                    except Exception as error:  # e.g. es.FitnessError: first log and checkpoint this segment
                        failure = error
            metrics = {name: to_numpy(values) for name, values in segment_metrics.items()}
            length = len(next(iter(metrics.values())))
            elapsed = time_offset + time.perf_counter() - clock
            metrics[TIME_NAME] = np.full((length,), elapsed, np.float64)
            if not buffers:
                buffers = _history_buffers(history, metrics, start, num_generations)
            for name, values in metrics.items():
                buffers[name][generation:generation + length] = values
            stop = generation + length
            done = {name: values[:stop] for name, values in buffers.items()}
            if log is not None:
                log.append(done, generation, stop)
            if checkpointer is not None:
                checkpointer.save(segment_state, done, identity, initial_digest)
            bar.set_postfix_str(
                f"best {metrics['best_fitness'][-1]:.5g}, mean {metrics['fitness_mean'][-1]:.5g}", refresh=False
            )
            bar.update(length)
            if on_segment is not None:
                segment_metrics = {k: v for k, v in metrics.items() if k != TIME_NAME}
                on_segment(Segment(generation, stop, segment_state, segment_metrics, elapsed))
            generation, state = stop, segment_state
            if failure is not None:
                raise failure
    finally:
        stopper.restore()
        bar.close()
    stopped = stop_signal if generation < num_generations else None
    if stopped is None and params_dir is not None:
        save_params(params_dir / PARAMS_NAME, state.params, state.best_params)
    done = {name: values[:generation] for name, values in (buffers or history).items()}
    time_s = done.pop(TIME_NAME, np.zeros((0,), np.float64))
    return RunResult(state, done, time_s, stopped)


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
