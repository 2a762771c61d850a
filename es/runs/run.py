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
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
from jax.sharding import Mesh

from es.parallel import distributed
from es.runs.checkpoint import (
    CheckpointError, Checkpointer, CheckpointWarning, CorruptCheckpointError, describe_difference, save_params,
    state_digest, to_numpy,
)
from es.parallel.distributed import is_writer
from es.engine import check_evolve_args, evolve_checked
from es.fitness import adapter
from es.runs.metrics_log import MetricsLog
from es.strategies.base import State, Strategy
from es import validation
from es.engine import check_evolve_many_args, evolve_many_checked

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
        after each segment is logged and its checkpoint started (written
        asynchronously), on every process (use
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
    _check_run_args("es.run", num_generations, segment, keep_checkpoints, resume, on_segment)
    _check_run_dir("es.run", "run_dir", run_dir)
    _check_config("es.run", "config", config)
    mesh, execution = check_evolve_args(
        strategy, fitness_fn, state, num_generations, mesh, exchange, eval_batch_size, update_batch_size
    )
    advance = functools.partial(evolve_checked, strategy, fitness_fn, mesh=mesh, execution=execution)
    runs = [_Run(run_dir, _identity(config, strategy, execution, mesh))]
    try:
        results = _run_all(
            _Segments(advance, lambda states: states[0], lambda state: [state], lambda metrics: [metrics]), runs,
            [state], num_generations, segment, keep_checkpoints, resume,
            on_segment and (lambda segments: on_segment(segments[0])), progress, description, handle_signals,
        )
    finally:
        adapter(fitness_fn).close()  # an es.HostFitness stops its workers
    return results[0]


def run_many(
    strategies: Sequence[Strategy],
    fitness_fn: Callable,
    states: Sequence[State],
    num_generations: int,
    *,
    run_dirs: Sequence[str | os.PathLike] | None = None,
    segment: int = 50,
    keep_checkpoints: int = 3,
    configs: Sequence[Any] | None = None,
    resume: bool = False,
    mesh: Mesh | None = None,
    exchange: str = "fitness",
    eval_batch_size: int | None = None,
    update_batch_size: int | None = None,
    on_segment: Callable[[list[Segment]], None] | None = None,
    progress: bool = True,
    description: str = "es",
    handle_signals: bool = True,
) -> list[RunResult]:
    """``es.run`` for the runs of an ``es.evolve_many`` sweep: one program, one directory per run, one progress bar.

    Every segment is one ``es.evolve_many`` call over all the runs (compiled
    once); after it each run's metrics are appended to its own
    ``metrics.jsonl`` and its state checkpointed in its own directory, exactly
    as ``es.run`` writes them, so a run directory of a sweep is also a run
    directory that ``es.run`` can resume alone. Signals, pipelining and
    multi-process behaviour are those of ``es.run``.

    Args:
      strategies, fitness_fn, states: as for ``es.evolve_many`` (one strategy
        and one initial state per run).
      num_generations, segment, resume, mesh, exchange, eval_batch_size,
        update_batch_size, progress, description, handle_signals: as for
        ``es.run``; they apply to every run.
      run_dirs: one directory per run (distinct), or ``None`` to write nothing.
      keep_checkpoints: checkpoints kept per run, at least 2 (see below).
      configs: one JSON-serialisable config per run (as ``es.run``'s
        ``config``; e.g. its seed and hyperparameters), or ``None``.
      on_segment: called after each segment with the list of every run's
        ``es.Segment``.

    Resume: each run restores its latest intact checkpoint, with every check
    ``es.run`` makes. A process killed while the runs' checkpoints of one
    segment were being written can leave some runs one segment ahead of
    others; the sweep then resumes every run from the latest generation that
    all of them reached (the checkpoints of one segment are started only once
    every run's previous ones are on disk, and the two latest are kept, so
    that generation is always on disk) and drops the newer checkpoints, which
    the resumed run writes again, identical.

    Returns:
      One ``RunResult`` per run, in order.
    """
    _check_run_args("es.run_many", num_generations, segment, keep_checkpoints, resume, on_segment)
    count = len(strategies) if isinstance(strategies, (list, tuple)) else None
    sweep = check_evolve_many_args(
        strategies, fitness_fn, states, num_generations, mesh, exchange, eval_batch_size, update_batch_size
    )
    run_dirs = _check_per_run("run_dirs", run_dirs, count)
    configs = _check_per_run("configs", configs, count)
    for i, (run_dir, config) in enumerate(zip(run_dirs, configs)):
        _check_run_dir("es.run_many", f"run_dirs[{i}]", run_dir)
        _check_config("es.run_many", f"configs[{i}]", config)
    if run_dirs[0] is not None:
        resolved = [pathlib.Path(d).resolve() for d in run_dirs]
        if len(set(resolved)) < len(resolved):
            raise ValueError("es.run_many(run_dirs=...): every run needs its own directory; two runs name the same.")
        if keep_checkpoints < 2:
            raise ValueError(
                f"es.run_many(keep_checkpoints={keep_checkpoints}): a sweep keeps at least 2 checkpoints per run, so "
                "that a process killed while writing one segment's checkpoints can resume every run from the "
                "previous segment; use keep_checkpoints=2 or more."
            )
    runs = [_Run(d, _identity(c, s, sweep.execution, sweep.mesh)) for d, c, s in zip(run_dirs, configs, strategies)]
    advance = functools.partial(evolve_many_checked, sweep, fitness_fn)
    try:
        return _run_all(
            _Segments(advance, list, list, list), runs, list(states),
            num_generations, segment, keep_checkpoints, resume, on_segment, progress, description, handle_signals,
        )
    finally:
        adapter(fitness_fn).close()  # an es.HostFitness stops its workers


def _identity(config, strategy: Strategy, execution, mesh: Mesh) -> Any:
    """What a run's checkpoints record as its identity (compared on resume), as JSON data."""
    return json.loads(json.dumps(
        {"config": config, "strategy": strategy.describe(), "execution": execution.identity(mesh.size)}
    ))


def _check_run_args(owner, num_generations, segment, keep_checkpoints, resume, on_segment) -> None:
    validation.check_int(owner, "num_generations", num_generations, 0)
    validation.check_int(owner, "segment", segment, 1)
    validation.check_int(owner, "keep_checkpoints", keep_checkpoints, 1)
    validation.check_bool(owner, "resume", resume)
    if on_segment is not None and not callable(on_segment):
        raise TypeError(f"{owner}(on_segment={on_segment!r}): on_segment must be a callable on_segment(segment) or None.")


def _check_run_dir(owner: str, name: str, run_dir) -> None:
    if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):
        raise TypeError(f"{owner}({name}={run_dir!r}): {name} must be a path or None.")


def _check_config(owner: str, name: str, config) -> None:
    try:
        json.dumps(config, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"{owner}({name}=...): {name} must be JSON-serialisable (dicts with str keys, lists, "
            f"str, finite numbers, bools, None): {error}."
        ) from None


def _check_per_run(name: str, values, count: int) -> list:
    """``values`` as a list of ``count`` entries (``None``: ``count`` times ``None``)."""
    if values is None:
        return [None] * count
    if not isinstance(values, (list, tuple)) or len(values) != count:
        raise ValueError(
            f"es.run_many({name}=...): give a list with one entry per run ({count}), or None; got "
            f"{len(values) if isinstance(values, (list, tuple)) else type(values).__name__}."
        )
    if name == "run_dirs" and any(v is None for v in values) and not all(v is None for v in values):
        raise ValueError("es.run_many(run_dirs=...): give every run a directory, or pass run_dirs=None.")
    return list(values)


class _Segments(NamedTuple):
    """How the segment loop drives the run(s).

    ``advance(state, n)`` runs ``n`` generations and returns ``(state,
    metrics)``: ``es.evolve``'s, or ``es.evolve_many``'s lists. ``join(states)``
    makes ``advance``'s state from every run's; ``states_of(state)`` and
    ``metrics_of(metrics)`` give every run's back.
    """

    advance: Callable
    join: Callable
    states_of: Callable
    metrics_of: Callable


class _Run:
    """One run of the segment loop: its directory and identity, and what it opened (writers: log, checkpoints)."""

    def __init__(self, run_dir, identity):
        self.run_dir = None if run_dir is None else pathlib.Path(run_dir)
        self.identity = identity
        self.checkpointer: Checkpointer | None = None
        self.log: MetricsLog | None = None
        self.initial_digest: str | None = None
        self.history: dict = {}


def _run_all(segments, runs, states, num_generations, segment, keep_checkpoints, resume, on_segment, progress,
             description, handle_signals) -> list[RunResult]:
    """Open (or resume) every run, run the segment loop, close the checkpointers; one ``RunResult`` per run."""
    writer = is_writer()
    name = f"es.run/{next(_run_numbers)}"
    try:
        start, states = _open_runs(runs, states, resume, num_generations, keep_checkpoints, name)
        results = _run_segments(
            segments, runs, states, num_generations, segment, start, writer and progress, description,
            handle_signals, name, on_segment,
        )
    finally:
        for each in runs:
            if each.checkpointer is not None:
                each.checkpointer.close()  # process 0: the last checkpoint is on disk
    if runs[0].run_dir is not None:  # and every process returns only once it is (a resume may follow at once)
        distributed.all_processes(f"{name}/closed")
    return results


def _open_runs(runs, states, resume, num_generations, keep_checkpoints, name) -> tuple[int, list[State]]:
    """Open every run's directory and find where each resumes; all resume at one generation. ``(start, states)``."""
    if runs[0].run_dir is None:
        return 0, states
    writer = is_writer()
    points = []
    for index, (each, state) in enumerate(zip(runs, states)):
        here = f"{name}/{index}" if len(runs) > 1 else name
        run_dir = each.run_dir
        each.initial_digest = state_digest(state)
        # Process 0 opens the checkpoints first (removing what a killed write left behind); then every
        # process reads them, and they check that they all resume from the same one. Each step ends in an
        # exchange of its outcome, so that an error on any process stops every process there.
        outcome = ""
        try:
            if writer:
                each.checkpointer = Checkpointer(run_dir / CHECKPOINTS_NAME, keep_checkpoints, writer=True)
        except Exception as error:  # any error: every process must reach the exchange
            outcome = error
        _agree_on(f"{here}/opened", run_dir, outcome)
        try:
            if not writer:
                each.checkpointer = Checkpointer(run_dir / CHECKPOINTS_NAME, keep_checkpoints, writer=False)
            point = _resume_point(each.checkpointer, run_dir, state, each.identity, each.initial_digest, resume,
                                  num_generations)
            digest = each.initial_digest if point.state is state else state_digest(point.state)
            outcome = f"{point.generation} {digest}"
        except Exception as error:  # CheckpointError and any other: every process must reach the exchange
            outcome = error
        _check_same_resume_point(_agree_on(f"{here}/resume", run_dir, outcome), run_dir)
        points.append(point)
    start = min(point.generation for point in points)
    for index, (each, state) in enumerate(zip(runs, states)):
        if points[index].generation > start:  # a sweep killed between its runs' checkpoints: back to `start`
            outcome = ""
            try:
                points[index] = _resume_point_at(each.checkpointer, each.run_dir, state, each.identity,
                                                 each.initial_digest, start, points[index])
            except Exception as error:  # every process must reach the exchange
                outcome = error
            _agree_on(f"{name}/{index}/common", each.run_dir, outcome)
        point = points[index]
        if writer:
            for generation in point.corrupt:  # newer than the resume point: out of the way of new saves
                each.checkpointer.quarantine(generation, each.run_dir / CORRUPT_NAME)
            for generation in point.superseded:  # intact but ahead of the other runs: written again, identical
                each.checkpointer.delete(generation)
            each.log = MetricsLog(each.run_dir / LOG_NAME)
            each.log.rewrite(point.history, start)  # exactly the checkpointed generations, nothing after
        each.history = point.history
    return start, [point.state for point in points]


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
    superseded: tuple[int, ...] = ()  # newer intact checkpoints of a sweep's run that was ahead of the others


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
    _check_checkpoint(checkpoint, identity, initial_digest)
    if checkpoint.generation > num_generations:
        raise CheckpointError(
            f"the run in {run_dir} has already done {checkpoint.generation} generations, more than "
            f"num_generations={num_generations}; ask for at least {checkpoint.generation}."
        )
    return _ResumePoint(checkpoint.generation, checkpoint.state, checkpoint.history, tuple(g for g, _ in corrupt))


def _check_checkpoint(checkpoint, identity, initial_digest) -> None:
    """Refuse a checkpoint of another run: another identity (config, strategy, execution) or initial state."""
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


def _resume_point_at(checkpointer, run_dir, state, identity, initial_digest, generation, latest) -> _ResumePoint:
    """A sweep's run restored at ``generation``, older than its own resume point ``latest``.

    The runs of ``run_many`` resume together, at the latest generation every
    run reached; the run's intact checkpoints after it are marked superseded.
    """
    superseded = tuple(g for g in checkpointer.generations() if g > generation and g not in latest.corrupt)
    if generation == 0:
        return _ResumePoint(0, state, {}, latest.corrupt, superseded)
    try:
        checkpoint = checkpointer.restore(generation, like=state)
    except CheckpointError as error:
        raise CheckpointError(
            f"the runs of this sweep resume together at generation {generation}, the latest that every run "
            f"reached, but {run_dir} cannot: {error}"
        ) from None
    _check_checkpoint(checkpoint, identity, initial_digest)
    return _ResumePoint(generation, checkpoint.state, checkpoint.history, latest.corrupt, superseded)


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


def _run_segments(segments, runs, states, num_generations, segment, start, show_progress, description,
                  handle_signals, run_name, on_segment) -> list[RunResult]:
    """The segment loop of ``run`` and ``run_many``: ``segments.advance(state, n)`` runs ``n`` generations.

    ``runs[i].log`` and ``.checkpointer`` write only on the writing process (``None`` elsewhere, or without
    a run directory).
    """
    from tqdm.auto import tqdm

    buffers: list[dict[str, np.ndarray]] = [{} for _ in runs]
    time_offset = float(runs[0].history[TIME_NAME][-1]) if start else 0.0
    bar = tqdm(total=num_generations, initial=start, unit="gen", desc=description, disable=not show_progress,
               file=sys.stderr, dynamic_ncols=True, smoothing=0.3)
    stopper = _Stopper(handle_signals, verbose=is_writer(), run_name=run_name)
    lengths = collections.deque(segment_lengths(start, num_generations, segment))
    generation = start
    stop_signal = failure = None
    writes = is_writer() and runs[0].run_dir is not None
    state = segments.join(states)
    clock = time.perf_counter()
    try:
        if lengths:
            bar.set_postfix_str("compiling", refresh=True)
        in_flight = segments.advance(state, lengths.popleft()) if lengths else None
        while in_flight is not None:
            segment_state, segment_metrics = in_flight
            in_flight = None
            if lengths:  # dispatch the next segment before waiting for this one, unless stopping
                stop_signal = stopper.agreed(generation)
                if stop_signal is None:
                    try:
                        in_flight = segments.advance(segment_state, lengths.popleft())
                    except Exception as error:  # e.g. es.FitnessError: first log and checkpoint this segment
                        failure = error
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
            if failure is not None:
                raise failure
    finally:
        stopper.restore()
        bar.close()
    stopped = stop_signal if generation < num_generations else None
    results = []
    for index, (each, run_state) in enumerate(zip(runs, segments.states_of(state))):
        if stopped is None and writes:
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
