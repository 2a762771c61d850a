"""``RunOptions``: the keyword arguments ``es.run`` and ``es.run_many`` share, checked once.

Both entry points keep their own keyword signatures (every keyword and default
documented in ``docs/runs.md``); each builds one frozen ``RunOptions`` from its
keywords, checks it, and hands that one object to the code both share (opening
the run directories, the segment loop, stopping). Its field defaults are the
defaults of both signatures.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

from jax.sharding import Mesh

from es import validation


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How a run (``es.run``) or the runs of a sweep (``es.run_many``) execute; every field as documented there.

    Attributes:
      num_generations: total generations, counted from the initial state.
      segment: generations per compiled call; log, progress bar and checkpoint after each.
      keep_checkpoints: how many of the latest checkpoints each run keeps.
      resume: continue from the latest intact checkpoint.
      mesh, exchange, eval_batch_size, update_batch_size: as for ``es.evolve``.
      on_segment: called after each segment (``es.Segment``, or their list for ``run_many``).
      on_start: called as ``on_start(generation)`` on every process once the run is accepted (every
        check passed, the resume point agreed), before anything is written to the run directory.
      progress, description: the progress bar and its label.
      handle_signals: SIGTERM/SIGINT finish the segment in progress, checkpoint and return.
    """

    num_generations: int
    segment: int = 50
    keep_checkpoints: int = 3
    resume: bool = False
    mesh: Mesh | None = None
    exchange: str = "fitness"
    eval_batch_size: int | None = None
    update_batch_size: int | None = None
    on_segment: Callable | None = None
    on_start: Callable[[int], None] | None = None
    progress: bool = True
    description: str = "es"
    handle_signals: bool = True

    def check(self, owner: str) -> "RunOptions":
        """``self`` once its own fields are valid (``es.evolve``'s checks cover the execution fields)."""
        validation.check_int(owner, "num_generations", self.num_generations, 0)
        validation.check_int(owner, "segment", self.segment, 1)
        validation.check_int(owner, "keep_checkpoints", self.keep_checkpoints, 1)
        validation.check_bool(owner, "resume", self.resume)
        for name in ("on_segment", "on_start"):
            hook = getattr(self, name)
            if hook is not None and not callable(hook):
                raise TypeError(f"{owner}({name}={hook!r}): {name} must be a callable or None.")
        return self

    def evolve_arguments(self) -> tuple:
        """``(mesh, exchange, eval_batch_size, update_batch_size)``, as ``es.evolve``'s checks take them."""
        return self.mesh, self.exchange, self.eval_batch_size, self.update_batch_size


def check_run_dir(owner: str, name: str, run_dir) -> None:
    if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):
        raise TypeError(f"{owner}({name}={run_dir!r}): {name} must be a path or None.")


def check_config(owner: str, name: str, config: Any) -> None:
    try:
        json.dumps(config, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"{owner}({name}=...): {name} must be JSON-serialisable (dicts with str keys, lists, "
            f"str, finite numbers, bools, None): {error}."
        ) from None


def check_per_run(name: str, values, count: int) -> list:
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
