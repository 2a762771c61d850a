"""Where runs resume: the latest intact checkpoint of each, checked against the run, agreed by every process.

``open_runs`` finds every run's resume point (falling back past corrupt
checkpoints), checks that it belongs to this run (identity, initial state,
generations) and that every process resumes from the same one, brings the runs
of a sweep to one common generation, and then, on the writing process, opens
the checkpoints for writing and rewrites each log from its checkpoint.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import NamedTuple

from es.parallel import distributed
from es.parallel.distributed import is_writer
from es.runs.checkpoint import (
    CheckpointError, Checkpointer, CheckpointWarning, CorruptCheckpointError, describe_difference,
)
from es.runs.host_arrays import state_digest
from es.runs.metrics_log import MetricsLog
from es.runs.options import RunOptions
from es.runs.segments import CHECKPOINTS_NAME, CORRUPT_NAME, LOG_NAME, RunDir
from es.strategies.base import State


def open_runs(runs: list[RunDir], states: list[State], options: RunOptions, name: str) -> tuple[int, list[State]]:
    """Find where every run resumes, then open the runs for writing; all resume at one generation.

    ``(start, states)``. First every process reads (nothing is written): each run's resume point, checked
    and agreed by every process, and for a sweep the latest generation every run reached. A refusal stops
    here, every run directory as it was. Once the runs are accepted, ``options.on_start(start)`` runs, and
    the writing process opens the checkpoints for writing (removing what a killed write left), moves the
    corrupt checkpoints it skipped aside (one ``CheckpointWarning`` each) and rewrites each log from its
    checkpoint.
    """
    if runs[0].run_dir is None:
        if options.on_start is not None:
            options.on_start(0)
        return 0, states
    readers = []
    try:
        points = []
        for index, (each, state) in enumerate(zip(runs, states)):
            here = f"{name}/{index}" if len(runs) > 1 else name
            each.initial_digest = state_digest(state)
            readers.append(Checkpointer(each.run_dir / CHECKPOINTS_NAME, options.keep_checkpoints, writer=False))
            point, everyone = _agree(
                f"{here}/resume", each.run_dir,
                lambda: resume_point(readers[-1], each.run_dir, state, each.identity, each.initial_digest,
                                     options.resume, options.num_generations),
                lambda point: f"{point.generation} "
                              f"{each.initial_digest if point.state is state else state_digest(point.state)}",
            )
            check_same_resume_point(everyone, each.run_dir)
            points.append(point)
        start = min(point.generation for point in points)
        for index, (each, state) in enumerate(zip(runs, states)):
            if points[index].generation > start:  # a sweep killed between its runs' checkpoints: back to `start`
                points[index], _ = _agree(
                    f"{name}/{index}/common", each.run_dir,
                    lambda: resume_point_at(readers[index], each.run_dir, state, each.identity, each.initial_digest,
                                            start, points[index]),
                )
    finally:
        for reader in readers:
            reader.close()
    _agree(f"{name}/opened", runs[0].run_dir, lambda: _start_writing(runs, points, options, start))
    for each, point in zip(runs, points):
        each.history = point.history
    return start, [point.state for point in points]


def _start_writing(runs: list[RunDir], points: list[ResumePoint], options: RunOptions, start: int) -> None:
    """The runs are accepted: ``on_start``, then (process 0) open them for writing and repair what was found."""
    if options.on_start is not None:
        options.on_start(start)
    if not is_writer():
        return
    for each, point in zip(runs, points):
        each.checkpointer = Checkpointer(each.run_dir / CHECKPOINTS_NAME, options.keep_checkpoints, writer=True)
        for generation, reason in point.corrupt:  # newer than the resume point: out of the way of new saves
            moved = each.checkpointer.quarantine(generation, each.run_dir / CORRUPT_NAME)
            where = f"{each.checkpointer.directory / str(start)} (generation {start})" if start else "generation 0"
            warnings.warn(f"{reason}; moved it to {moved}, resuming from the previous intact checkpoint, {where}.",
                          CheckpointWarning, stacklevel=_caller_outside_es())
        for generation in point.superseded:  # intact but ahead of the other runs: written again, identical
            each.checkpointer.delete(generation)
        each.log = MetricsLog(each.run_dir / LOG_NAME)
        each.log.rewrite(point.history, start)  # exactly the checkpointed generations, nothing after


def _caller_outside_es() -> int:
    """The ``stacklevel`` of a warning raised here that points at the first caller outside the ``es`` package."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def _agree(name: str, run_dir, step, summary=lambda value: ""):
    """``distributed.agree_on_outcome`` of one step of opening ``run_dir``: a process that sees another fail
    raises a ``CheckpointError`` naming it."""
    return distributed.agree_on_outcome(
        name, step, summary,
        lambda process, text: CheckpointError(f"process {process} cannot start the run in {run_dir}: {text}"),
    )


def check_same_resume_point(everyone: list[str], run_dir) -> None:
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


class ResumePoint(NamedTuple):
    generation: int
    state: State
    history: dict
    corrupt: tuple[tuple[int, str], ...] = ()  # newer checkpoints skipped as corrupt: (generation, why)
    superseded: tuple[int, ...] = ()  # newer intact checkpoints of a sweep's run that was ahead of the others


def resume_point(checkpointer, run_dir, state, identity, initial_digest, resume, num_generations) -> ResumePoint:
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
        return ResumePoint(0, state, {})
    corrupt = []
    for generation in reversed(generations):
        try:
            checkpoint = checkpointer.restore(generation, like=state)
        except CorruptCheckpointError as error:
            corrupt.append((generation, str(error)))
            continue
        break
    else:
        if corrupt:
            raise CheckpointError(
                f"no intact checkpoint in {checkpointer.directory}: {'; '.join(why for _, why in corrupt)}. "
                "Start a new run (or move the run directory away)."
            )
        return ResumePoint(0, state, {})
    check_checkpoint(checkpoint, identity, initial_digest)
    if checkpoint.generation > num_generations:
        raise CheckpointError(
            f"the run in {run_dir} has already done {checkpoint.generation} generations, more than "
            f"num_generations={num_generations}; ask for at least {checkpoint.generation}."
        )
    return ResumePoint(checkpoint.generation, checkpoint.state, checkpoint.history, tuple(corrupt))


def check_checkpoint(checkpoint, identity, initial_digest) -> None:
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


def resume_point_at(checkpointer, run_dir, state, identity, initial_digest, generation, latest) -> ResumePoint:
    """A sweep's run restored at ``generation``, older than its own resume point ``latest``.

    The runs of ``run_many`` resume together, at the latest generation every
    run reached; the run's intact checkpoints after it are marked superseded.
    """
    skipped = {g for g, _ in latest.corrupt}
    superseded = tuple(g for g in checkpointer.generations() if g > generation and g not in skipped)
    if generation == 0:
        return ResumePoint(0, state, {}, latest.corrupt, superseded)
    try:
        checkpoint = checkpointer.restore(generation, like=state)
    except CheckpointError as error:
        raise CheckpointError(
            f"the runs of this sweep resume together at generation {generation}, the latest that every run "
            f"reached, but {run_dir} cannot: {error}"
        ) from None
    check_checkpoint(checkpoint, identity, initial_digest)
    return ResumePoint(generation, checkpoint.state, checkpoint.history, latest.corrupt, superseded)
