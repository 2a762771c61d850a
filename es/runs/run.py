"""``es.run``: a long experiment in segments that users can watch, stop and resume.

    result = es.run(strategy, fitness_fn, state, 1000, run_dir="runs/x", segment=50)

The run calls ``es.evolve`` for ``segment`` generations at a time (one
compiled function, reused) and after each segment

- updates a progress bar (generation, best and mean fitness, generations/s);
- appends the segment's per-generation metrics to ``<run_dir>/metrics.jsonl``;
- writes a checkpoint to ``<run_dir>/checkpoints/<generation>/`` (orbax,
  asynchronous and atomic, the last ``keep_checkpoints`` kept).

Segments are pipelined: segment ``k + 1`` runs (on a helper thread) while the
host logs and checkpoints segment ``k``. A fitness on the host
(``es.HostFitness``) runs generation by generation instead, each segment
logged and checkpointed before the next starts.

The first SIGTERM or SIGINT stops the run at the next point where a checkpoint
can be written: the end of the segment in progress for a JAX fitness, the end
of the generation in progress for a fitness on the host (its segment is cut
short). It checkpoints there and returns a ``RunResult`` with ``stopped_by``
set. A second signal stops at once (``KeyboardInterrupt``, or ``SystemExit``
with status 143 for SIGTERM): the worker processes of an ``es.HostFitness``
are stopped and the last checkpoint stays valid. Both act however long a
segment or an evaluation takes: the calling thread waits in short,
interruptible steps (docs/runs.md measures how long each takes to act).
``resume=True`` continues from the latest checkpoint and ends bit-identical
to a run that was never interrupted, whenever the first one was killed.

Only process 0 writes anything (``is_writer``); every process computes. In a
multi-process run every process reads the checkpoint it resumes from, the
processes check that they resume from the same one, and they agree (through
JAX's coordination service, host-side) at every segment boundary whether to
stop, so a signal to any of them stops all of them after the same segment.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
from typing import Any, Callable, Sequence

from jax.sharding import Mesh

from es.engine import check_evolve_args, check_evolve_many_args, evolve_checked, evolve_many_checked
from es.engine.evolution import Generations
from es.fitness import adapter
from es.parallel import distributed
from es.runs.checkpoint import SETTLE_S, Checkpointer
from es.runs.options import RunOptions, check_config, check_per_run, check_run_dir
from es.runs.resume import open_runs
from es.runs.storage import RunDirError
from es.runs.segments import CHECKPOINTS_NAME, Driver, RunDir, RunResult, Segment, run_segments
from es.strategies.base import State, Strategy

# Numbers the es.run calls of this process, so that every call agrees with the other processes under its own
# names (every process makes the same es.run calls in the same order, as for es.evolve).
_run_numbers = itertools.count()


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
    on_start: Callable[[int], None] | None = None,
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
      on_start: called as ``on_start(generation)`` on every process once the
        run is accepted (every check passed; ``generation`` is where it
        starts, 0 or the resume point) and before ``es.run`` writes anything:
        write your own files into ``run_dir`` here (the CLI writes its
        ``config.yaml``), so that a refused call leaves the directory as it was.
      progress: show a tqdm progress bar on stderr (process 0 only).
      description: the progress bar's label.
      handle_signals: on SIGTERM/SIGINT finish the segment (for a fitness on
        the host: the generation), checkpoint and return; a second signal stops
        at once (only from the main thread). In a multi-process run a signal
        to any process stops every process after the same generation.

    What a resume may change: ``num_generations``, ``segment``,
    ``keep_checkpoints``, the mesh (see above), ``on_segment``, ``on_start``,
    ``progress``, ``description`` and ``handle_signals``; everything else is
    part of the run's identity.

    A refused call (``ValueError``, ``CheckpointError``) leaves ``run_dir``
    byte for byte as it was: nothing is written before the run is accepted.

    Returns:
      A ``RunResult``. Raises ``CheckpointError`` (a ``ValueError``) when no
      intact checkpoint can be resumed or it belongs to another run, and
      ``es.RunDirError`` (an ``OSError``) when ``run_dir`` cannot be written
      (no space left, read-only): it names the file and the cause, and the
      directory is left at its newest complete checkpoint, with nothing
      half-written, to resume once the cause is fixed. An error
      of a segment (such as ``es.FitnessError`` from an ``es.HostFitness``) is
      raised once the segments before it are logged and checkpointed, so
      ``resume=True`` continues from there. The workers of an
      ``es.HostFitness`` are stopped when the run returns or raises.
    """
    options = RunOptions(
        num_generations, segment, keep_checkpoints, resume, mesh, exchange, eval_batch_size, update_batch_size,
        on_segment, on_start, progress, description, handle_signals,
    ).check("es.run")
    check_run_dir("es.run", "run_dir", run_dir)
    check_config("es.run", "config", config)
    fitness = adapter(fitness_fn)  # the one adapter of the run
    mesh, execution = check_evolve_args(strategy, fitness, state, num_generations, *options.evolve_arguments())
    def advance(state: State, length: int, stop: Callable[[], bool]):  # every segment: one program
        return evolve_checked(strategy, fitness, state, Generations(length, options.segment), mesh, execution, stop)

    runs = [RunDir(run_dir, _identity(config, strategy, execution, mesh))]
    driver = Driver(advance, lambda states: states[0], lambda state: [state], lambda metrics: [metrics],
                    on_host=fitness.on_host)
    each_segment = on_segment and (lambda segments: on_segment(segments[0]))
    return _run_all(driver, fitness, runs, [state], options, each_segment)[0]


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
    on_start: Callable[[int], None] | None = None,
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
      on_start: as for ``es.run``: once every run is accepted, before anything
        is written, with the generation they all start from.

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
    options = RunOptions(
        num_generations, segment, keep_checkpoints, resume, mesh, exchange, eval_batch_size, update_batch_size,
        on_segment, on_start, progress, description, handle_signals,
    ).check("es.run_many")
    count = len(strategies) if isinstance(strategies, (list, tuple)) else None
    if count == 0:
        raise ValueError("es.run_many(strategies=[]): a sweep needs at least one run: give one strategy and one "
                         "initial state per run (es.run runs a single one).")
    fitness = adapter(fitness_fn)  # the one adapter of the sweep
    sweep = check_evolve_many_args(strategies, fitness, states, num_generations, *options.evolve_arguments(),
                                   caller="es.run_many")
    run_dirs = check_per_run("run_dirs", run_dirs, count)
    configs = check_per_run("configs", configs, count)
    for i, (run_dir, config) in enumerate(zip(run_dirs, configs)):
        check_run_dir("es.run_many", f"run_dirs[{i}]", run_dir)
        check_config("es.run_many", f"configs[{i}]", config)
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
    runs = [RunDir(d, _identity(c, s, sweep.execution, sweep.mesh)) for d, c, s in zip(run_dirs, configs, strategies)]
    def advance(states: list[State], length: int, stop: Callable[[], bool]):
        del stop  # a sweep's fitness is JAX: its segments are whole programs
        return evolve_many_checked(sweep, fitness, states, Generations(length, options.segment))

    return _run_all(Driver(advance, list, list, list), fitness, runs, list(states), options, on_segment)


def _identity(config, strategy: Strategy, execution, mesh: Mesh) -> Any:
    """What a run's checkpoints record as its identity (compared on resume), as JSON data."""
    return json.loads(json.dumps(
        {"config": config, "strategy": strategy.describe(), "execution": execution.identity(mesh.size)}
    ))


def _run_all(driver: Driver, fitness, runs: list[RunDir], states: list[State], options: RunOptions,
             on_segment) -> list[RunResult]:
    """Open (or resume) every run, run the segment loop, close the checkpointers; one ``RunResult`` per run.

    The workers of an ``es.HostFitness`` are stopped when the runs return or raise.
    """
    name = f"es.run/{next(_run_numbers)}"
    try:
        try:
            start, states = open_runs(runs, states, options, name)
            results = run_segments(driver, runs, states, options, start, name, on_segment)
        except RunDirError as error:
            raise _left_consistent(runs, error) from error
        finally:
            for each in runs:
                if each.checkpointer is not None:
                    each.checkpointer.close()  # process 0: the last checkpoint is on disk
        if runs[0].run_dir is not None:  # and every process returns only once it is (a resume may follow at once)
            distributed.all_processes(f"{name}/closed")
    finally:
        fitness.close()  # an es.HostFitness stops its workers
    return results


def _left_consistent(runs: list[RunDir], error: RunDirError) -> RunDirError:
    """After a failed write: every run directory back at its newest complete checkpoint; the error, saying so.

    The checkpoints still being written are waited for (one that fails too is removed, as the failed one
    was), orbax's temporary directories removed until none has appeared for ``checkpoint.SETTLE_S``, and each
    log is cut back to the newest complete checkpoint (cutting needs no space).
    """
    written = [each for each in runs if each.checkpointer is not None]
    for each in written:
        try:
            each.checkpointer.close()
        except RunDirError:  # the same cause, most likely; the first error is the one reported
            pass
        each.checkpointer = None
    Checkpointer.remove_partial_writes(*(each.run_dir / CHECKPOINTS_NAME for each in written), settle_s=SETTLE_S)
    reached = []
    for each in written:
        complete = Checkpointer.generations_on_disk_of(each.run_dir / CHECKPOINTS_NAME)
        newest = complete[-1] if complete else 0
        reached.append(newest)
        if each.log is not None:
            try:
                each.log.cut(newest)
            except RunDirError:
                pass
    if not reached:
        return error
    where = runs[0].run_dir if len(runs) == 1 else "each run directory"
    return error.with_context(
        f"Nothing half-written is left: {where} holds the run up to its newest complete checkpoint "
        f"(generation {min(reached)}). Free space or make the directory writable, then resume "
        f"(resume=True; CLI: --resume)."
    )
