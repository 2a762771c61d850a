"""The per-generation metrics log, ``metrics.jsonl``: one JSON object per generation.

Each line is ``{"generation": g, <metric>: value, ..., "time_s": t}`` for
generation ``g`` (0-based: the generation whose population the values
describe; its perturbations used ``sigma_at(g)``). ``time_s`` is the run's
wall-clock seconds when the segment holding ``g`` finished (time spent
stopped between a stop and a resume is not counted). Float32 metrics are
written with Python's shortest round-trip repr, so parsing a line gives back
the exact float32 value; non-finite values are written as ``NaN``,
``Infinity`` and ``-Infinity`` (Python's ``json`` reads them).

The log is a view of the checkpointed history: on resume it is rewritten
from the checkpoint (atomically), so lines written after the last checkpoint
by a killed run, and a half-written last line, disappear and are written
again; no generation is lost or repeated.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from es.runs import storage


def format_lines(history: dict[str, np.ndarray], start: int, stop: int) -> str:
    """The log lines of generations ``[start, stop)`` of ``history`` (name -> array [>= stop])."""
    lines = []
    for g in range(start, stop):
        row = {"generation": g}
        for name, values in history.items():
            row[name] = values[g].item()
        lines.append(json.dumps(row) + "\n")
    return "".join(lines)


class MetricsLog:
    """Appends to and rewrites one ``metrics.jsonl`` file, whole lines or nothing (``RunDirError`` otherwise)."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        self._ends: dict[int, int] = {}  # generation -> the file's size once the lines before it are written

    def rewrite(self, history: dict[str, np.ndarray], num_generations: int) -> None:
        """Replace the file by the lines of generations ``[0, num_generations)``, atomically."""
        text = format_lines(history, 0, num_generations)
        storage.write_atomically(self.path, text)
        self._ends = {num_generations: len(text.encode())}

    def append(self, history: dict[str, np.ndarray], start: int, stop: int) -> None:
        """Append the lines of generations ``[start, stop)``: all of them, or none."""
        self._ends[stop] = storage.append_whole(self.path, format_lines(history, start, stop))

    def cut(self, generation: int) -> None:
        """Drop the lines from ``generation`` on (written by this process; the log then ends at a checkpoint).

        Cutting a file needs no space, so this works on a full disk too.
        """
        if generation in self._ends:
            with storage.writing(self.path):
                os.truncate(self.path, self._ends[generation])


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The rows of a ``metrics.jsonl`` file.

    A last line without its newline (a run writing at this moment, or killed
    mid-write) is skipped; any other line that is not JSON raises ``ValueError``.
    """
    path = pathlib.Path(path)
    text = path.read_text()
    lines = text.split("\n")
    complete = lines[:-1]  # the last piece is unterminated: still being written, or cut off by a kill
    rows = []
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number} is not a JSON object ({error}): {line[:80]!r}") from None
    return rows
