"""Checkpoints of a run (orbax-checkpoint): the ES state, the metrics so far and the run's config.

A checkpoint is the directory ``<checkpoints>/<generation>/``. Orbax writes it
to a temporary directory and renames it when complete, so a process killed
mid-write leaves no half checkpoint (the leftover temporary directory is
removed when the run is reopened; so is an old checkpoint whose deletion,
to keep only the last n, a kill interrupted). Each holds two orbax items:

- ``arrays``: ``state``, every array of the ``State`` (PRNG keys as
  their raw key data, rebuilt as the same kind of key on restore), and
  ``history``, the per-generation metrics so far, one array per metric with
  leading axis ``generation``;
- ``meta`` (JSON): format version, generation, the run's config, the state's
  signature (path, shape and dtype of every leaf), the SHA-256 of every array
  saved, the digest of the state the run started from, and the SHA-256 of this
  record itself (``record_sha256``, over every other field).

Restoring checks all of it. Damage anywhere (metadata that does not parse or
fails its own checksum, arrays that cannot be read or fail theirs) raises
``CorruptCheckpointError``, so that a run falls back to the checkpoint before;
an intact checkpoint that does not fit (another version of es, another run's
state) is refused with a ``CheckpointError`` (a ``ValueError``) that says what
differs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pathlib
import shutil
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from es import compat
from es.runs import orbax_noise, storage
from es.runs.differences import describe_difference, signature_difference
from es.runs.host_arrays import KEY_DTYPE_PREFIX, digest, host_leaves, signature, state_digest, to_numpy
from es.runs.params_file import load_params, save_params
from es.strategies.base import State

__all__ = [  # es.checkpoint; the names now in host_arrays and params_file stay importable from here
    "FORMAT", "OLDER_FORMATS", "Checkpoint", "CheckpointError", "CheckpointWarning", "Checkpointer",
    "CorruptCheckpointError", "describe_difference", "load_params", "save_params", "signature", "state_digest",
    "to_numpy",
]

# 2: es.State (params, strategy_state, ...) and the run identity in "config".
# 3: the record's own checksum ("record_sha256"); OpenES/PGPE optimizer states over one flat float vector.
FORMAT = "es-checkpoint-3"
# Formats of earlier versions, whose records carry no checksum of their own: refused, never taken for damage.
OLDER_FORMATS = {
    "es-checkpoint-1": "an es.State of another layout",
    "es-checkpoint-2": "strategy states of the layout before the one-contract strategies (OpenES and PGPE kept "
                       "their optimizer state per params leaf)",
}
# The fields of a checkpoint's metadata record that ``restore`` reads.
_META_FIELDS = ("format", "generation", "config", "signature", "history", "sha256", "initial_sha256")
_RECORD_CHECKSUM = "record_sha256"


# What orbax writes into every checkpoint before renaming it into place: our two items, its step
# metadata and its commit marker.
_COMMITTED_CHECKPOINT_ENTRIES = ("arrays", "meta", "_CHECKPOINT_METADATA", "commit_success.txt")


SETTLE_S = 0.25
"""After a failed write, how long no temporary directory of orbax's may appear before the run directory counts as
clean: orbax stops waiting at the first failed array, and tensorstore's writes of the others may still create
the checkpoint's temporary directories a few milliseconds later (seen on a loaded 2-core machine)."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: corrupt, or made by another run."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint whose files are unreadable, incomplete or fail their checksum."""


class CheckpointWarning(UserWarning):
    """Resuming from an older checkpoint because the newest one is corrupt."""


class Checkpoint(NamedTuple):
    """One restored checkpoint.

    Attributes:
      generation: generations completed when it was written.
      state: the ``State``, with the structure of the state it was restored into.
      history: metric name -> numpy array ``[generation]``.
      config: the JSON config the run was started with.
      initial_digest: ``state_digest`` of the state the run started from.
      path: its directory.
    """

    generation: int
    state: State
    history: dict[str, np.ndarray]
    config: Any
    initial_digest: str
    path: pathlib.Path


# --------------------------------------------------------------------------- the record and the arrays' names


def _record_digest(meta: dict) -> str:
    """SHA-256 of a metadata record without its own checksum field (keys sorted, compact JSON)."""
    fields = {name: value for name, value in meta.items() if name != _RECORD_CHECKSUM}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _leaf_name(index: int) -> str:
    """The name of the state's ``index``-th leaf in the ``arrays`` item."""
    return f"leaf_{index:05d}"


# --------------------------------------------------------------------------- the manager


class Checkpointer:
    """The checkpoints of one run: written asynchronously, last ``keep`` kept, verified on restore.

    Args:
      directory: where the checkpoints live (``<run_dir>/checkpoints``).
      keep: how many of the latest checkpoints to keep (>= 1).
      writer: whether this process writes (``es.is_writer()``); the others only read.
    """

    def __init__(self, directory: str | os.PathLike, keep: int = 3, writer: bool = True):
        import orbax.checkpoint as ocp

        self.directory = pathlib.Path(directory).absolute()
        self.writer = writer
        self._writing: int | None = None  # the generation of the latest save started
        if writer:
            with storage.writing(self.directory):
                self.directory.mkdir(parents=True, exist_ok=True)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep if writer else None,
            save_interval_steps=1 if writer else 0,
            create=False,
            read_only=not writer,
            cleanup_tmp_directories=writer,
            # The checkpoint's directories made in save() itself: a full disk fails it there. Made asynchronously,
            # a failed creation left orbax's item-writing threads (not daemons) waiting for its signal for
            # orbax's timeout (20 minutes), and the process could not exit until then.
            async_options=ocp.options.AsyncOptions(create_directories_asynchronously=False),
            # Only this process takes part: the arrays are host copies of replicated state,
            # so no other process has anything to write or to wait for.
            multiprocessing_options=ocp.options.MultiprocessingOptions(
                primary_host=jax.process_index(), active_processes={jax.process_index()}
            ),
        )
        self._ocp = ocp
        self._manager = None
        orbax_noise.drop_closed_event_loop_noise()
        if writer:
            with storage.writing(self.directory):
                self._remove_interrupted_deletions()
            try:
                self._manager = ocp.CheckpointManager(self.directory, options=options)
                # Removing a killed write's temporary directory runs in the background; finish it now, so that
                # a failure to remove it is reported here.
                compat.await_tmp_cleanup(self._manager)
            except Exception as error:  # orbax reports a read-only or full file system in many types
                raise storage.write_error(self.directory, error) from error
            logging.getLogger("absl").addFilter(orbax_noise.drop_orbax_errors)
        elif self.directory.is_dir():
            with orbax_noise.without_orbax_notices():
                self._manager = ocp.CheckpointManager(self.directory, options=options)

    def _remove_interrupted_deletions(self) -> None:
        """Finish deleting old checkpoints that a kill left half deleted.

        Orbax removes a checkpoint beyond the last ``keep`` file by file; killed
        meanwhile, it leaves a directory that still looks like a step but lacks
        some of what every committed checkpoint has. Only older checkpoints are
        ever deleted, so the newest is left alone (restoring it checks it).
        """
        steps = sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit() and p.is_dir())
        for step in steps[:-1]:
            path = self.directory / str(step)
            if not all((path / name).exists() for name in _COMMITTED_CHECKPOINT_ENTRIES):
                shutil.rmtree(path, ignore_errors=True)

    def generations(self) -> list[int]:
        """Generations of the checkpoints on disk, ascending: every ``<generation>/`` directory (a damaged one
        too: restoring it says so), not orbax's temporary ones."""
        if self._manager is None or not self.directory.is_dir():
            return []
        return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit() and p.is_dir())

    def save(self, state: State, history: dict[str, np.ndarray], config: Any, initial_digest: str) -> None:
        """Start writing a checkpoint of ``state`` (returns once the arrays are copied to the host)."""
        if not self.writer:
            return
        ocp = self._ocp
        leaves = host_leaves(state)
        history = {name: np.asarray(values) for name, values in history.items()}
        generation = int(to_numpy(state.generation))
        meta = {
            "format": FORMAT,
            "generation": generation,
            "config": config,
            "signature": [entry for entry, _ in leaves],
            "history": {name: str(values.dtype) for name, values in history.items()},
            "sha256": digest(
                [(entry["path"], array) for entry, array in leaves] + sorted(history.items())
            ),
            "initial_sha256": initial_digest,
        }
        meta[_RECORD_CHECKSUM] = _record_digest(meta)
        # Orbax cannot store zero-size arrays; their shape is in the signature.
        arrays = {"state": {_leaf_name(i): array for i, (_, array) in enumerate(leaves) if array.size}}
        if generation:
            arrays["history"] = history
        try:
            self._manager.save(
                generation, args=ocp.args.Composite(arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta))
            )
        except Exception as error:  # the previous save failed (orbax reports it now), or this one
            raise self._write_failed(error) from error
        self._writing = generation

    def record(self, generation: int) -> dict:
        """The metadata record of the checkpoint of ``generation``, verified against its own checksum.

        Raises ``CorruptCheckpointError`` if it cannot be read or is damaged, and ``CheckpointError`` if an
        earlier or later version of es wrote it (another format).
        """
        path = self.directory / str(generation)
        try:
            meta = self._manager.restore(
                generation, args=self._ocp.args.Composite(meta=self._ocp.args.JsonRestore())
            )["meta"]
        except Exception as error:  # orbax, tensorstore and json raise many types
            raise CorruptCheckpointError(f"checkpoint {path} is corrupt: its metadata cannot be read") from error
        if not isinstance(meta, dict):
            raise CorruptCheckpointError(f"checkpoint {path} is corrupt: its metadata is not a record")
        if _RECORD_CHECKSUM not in meta and meta.get("format") in OLDER_FORMATS:
            raise CheckpointError(
                f"checkpoint {path} was written by an earlier version of es, in the format {meta['format']!r} "
                f"({OLDER_FORMATS[meta['format']]}); this version reads and writes {FORMAT!r} and cannot continue "
                "it. Start a new run, or resume this one with the version of es that wrote it."
            )
        if meta.get(_RECORD_CHECKSUM) != _record_digest(meta):
            raise CorruptCheckpointError(f"checkpoint {path} is corrupt: its metadata does not match its checksum")
        if meta.get("format") != FORMAT:  # intact, so written so: by a later version
            raise CheckpointError(
                f"checkpoint {path} was written by another version of es, in the format {meta.get('format')!r}; "
                f"this version reads and writes {FORMAT!r}. Resume it with the version of es that wrote it, or "
                "start a new run."
            )
        missing = [field for field in _META_FIELDS if field not in meta]
        if missing or meta["generation"] != generation:  # a record this version did not write: damage
            raise CorruptCheckpointError(f"checkpoint {path} is corrupt: its metadata is not a checkpoint record")
        return meta

    def restore(self, generation: int, like: State) -> Checkpoint:
        """The checkpoint of ``generation``, rebuilt with the structure of ``like``.

        Raises ``CorruptCheckpointError`` if it is unreadable, incomplete or
        fails a checksum (of its metadata or of its arrays), and
        ``CheckpointError`` if another version of es wrote it or it holds a
        state of another structure, shape or dtype than ``like``.
        """
        ocp = self._ocp
        path = self.directory / str(generation)
        meta = self.record(generation)
        stored = meta["signature"]
        history_dtypes = {name: np.dtype(dtype) for name, dtype in meta["history"].items()}
        meta_generation = int(meta["generation"])
        stored_digest, stored_config, initial_digest = meta["sha256"], meta["config"], meta["initial_sha256"]
        expected = signature(like)
        if stored != expected:
            raise CheckpointError(
                f"checkpoint {path} holds a state of another structure than this run's: "
                f"{signature_difference(stored, expected)}. It was made for other params, "
                "another strategy or popsize, or another optimizer; resume it with the same task, params and "
                "strategy, or start a new run."
            )
        like_leaves = jax.tree.leaves(like)
        blanks = [np.zeros(_stored_shape(e, leaf), _stored_dtype(e)) for e, leaf in zip(stored, like_leaves)]
        targets = {_leaf_name(i): blank for i, blank in enumerate(blanks) if blank.size}
        history_targets = {
            name: np.zeros((meta_generation,), dtype) for name, dtype in history_dtypes.items()
        }
        array_targets = {"state": targets}
        if meta_generation:
            array_targets["history"] = history_targets
        try:
            restored = self._manager.restore(
                generation, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(array_targets))
            )["arrays"]
        except Exception as error:
            raise CorruptCheckpointError(f"checkpoint {path} is corrupt: its arrays cannot be read") from error
        arrays = [
            np.asarray(restored["state"][_leaf_name(i)]) if _leaf_name(i) in targets else blank
            for i, blank in enumerate(blanks)
        ]
        history = {
            name: np.asarray(restored["history"][name]) if meta_generation else history_targets[name]
            for name in history_dtypes
        }
        arrays_digest = digest([(e["path"], a) for e, a in zip(stored, arrays)] + sorted(history.items()))
        if arrays_digest != stored_digest:
            raise CorruptCheckpointError(
                f"checkpoint {path} is corrupt: its arrays do not match their checksum"
            )
        leaves = [_from_host(entry, array) for entry, array in zip(stored, arrays)]
        state = jax.tree.structure(like).unflatten(leaves)
        return Checkpoint(meta_generation, state, history, stored_config, initial_digest, path)

    def quarantine(self, generation: int, destination: pathlib.Path) -> pathlib.Path:
        """Move the checkpoint of ``generation`` out of the way, to ``destination/<generation>`` (kept, not deleted).

        A checkpoint no longer there (removed as a half-deleted one when this checkpointer opened) is left so.
        """
        if not (self.directory / str(generation)).exists():
            return self.directory / str(generation)
        target = destination / str(generation)
        suffix = 1
        while target.exists():
            suffix += 1
            target = destination / f"{generation}-{suffix}"
        with storage.writing(target):
            destination.mkdir(parents=True, exist_ok=True)
            shutil.move(str(self.directory / str(generation)), str(target))
        if self._manager is not None:
            self._manager.reload()
        return target

    def delete(self, generation: int) -> None:
        """Delete the checkpoint of ``generation`` (a sweep's run resuming before it writes it again)."""
        try:
            self._manager.delete(generation)
        except Exception as error:  # orbax reports a read-only file system in its own types
            raise storage.write_error(self.directory / str(generation), error) from error

    def wait(self) -> None:
        """Block until every checkpoint started so far is on disk; ``RunDirError`` if one could not be written."""
        if self._manager is not None:
            try:
                self._manager.wait_until_finished()
            except Exception as error:
                raise self._write_failed(error) from error

    def close(self) -> None:
        """Wait for the checkpoints started so far and close; ``RunDirError`` if one could not be written."""
        if self._manager is None:
            return
        manager, self._manager = self._manager, None
        try:
            manager.wait_until_finished()
        except Exception as error:
            raise self._write_failed(error) from error
        finally:
            with contextlib.suppress(Exception):  # closing after a failed write may fail the same way
                manager.close()
            logging.getLogger("absl").removeFilter(orbax_noise.drop_orbax_errors)

    def _write_failed(self, error: BaseException) -> storage.RunDirError:
        """A failed checkpoint write as a ``RunDirError``, once orbax's temporary directories of it are removed."""
        self.remove_partial_writes(self.directory)
        where = self.directory / str(self._writing) if self._writing is not None else self.directory
        return storage.write_error(where, error)

    @staticmethod
    def remove_partial_writes(*directories: pathlib.Path, settle_s: float = 0.0) -> None:
        """Remove what orbax left of checkpoints it did not finish writing (its temporary directories) in each of
        ``directories``; with ``settle_s``, again until none has appeared for that long (``SETTLE_S``: after a
        failed write), for at most ``4 * settle_s``."""
        start = quiet_since = time.monotonic()
        while True:
            partials = [partial for directory in directories if directory.is_dir()
                        for partial in directory.glob(f"*{compat.orbax_tmp_suffix()}*")]  # orbax's while writing
            for partial in partials:
                shutil.rmtree(partial, ignore_errors=True)
            now = time.monotonic()
            quiet_since = now if partials else quiet_since
            if now - quiet_since >= settle_s or now - start >= 4 * settle_s:
                return
            time.sleep(0.01)

    @staticmethod
    def generations_on_disk_of(directory: pathlib.Path) -> list[int]:
        """The complete checkpoints in ``directory``, listed afresh (also after a failed write), ascending."""
        if not directory.is_dir():
            return []
        return sorted(int(p.name) for p in directory.iterdir()
                      if p.name.isdigit() and all((p / name).exists() for name in _COMMITTED_CHECKPOINT_ENTRIES))

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _stored_dtype(entry: dict) -> np.dtype:
    """The dtype a leaf is stored as: key data is uint32."""
    if entry["dtype"].startswith(KEY_DTYPE_PREFIX):
        return np.dtype(np.uint32)
    return np.dtype(entry["dtype"])


def _stored_shape(entry: dict, like_leaf) -> tuple[int, ...]:
    """The shape a leaf is stored as: a key leaf adds its raw data's trailing axes (``[2]`` for threefry)."""
    if entry["dtype"].startswith(KEY_DTYPE_PREFIX):
        return tuple(jax.random.key_data(like_leaf).shape)
    return tuple(entry["shape"])


def _from_host(entry: dict, array: np.ndarray) -> jax.Array:
    dtype = entry["dtype"]
    if dtype.startswith(KEY_DTYPE_PREFIX):
        return jax.random.wrap_key_data(jnp.asarray(array), impl=dtype[len(KEY_DTYPE_PREFIX):-1])
    return jnp.asarray(array)
