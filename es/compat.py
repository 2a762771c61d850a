"""Every use of a private name of jax, orbax or optax, each with a fallback, in one place.

``tests/test_compat.py`` pins each to the versions ``pyproject.toml`` supports (jax 0.10, orbax-checkpoint
0.12, optax 0.2): there every function here takes its primary path, not the fallback. When a new release
moves a name, that test says which, and the fallback keeps ``es`` working meanwhile.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

ORBAX_TMP_SUFFIX = ".orbax-checkpoint-tmp"
"""What orbax appends to the name of a checkpoint it is still writing (``orbax.checkpoint``'s private
``TMP_DIR_SUFFIX``; renamed when complete)."""


@functools.cache
def orbax_tmp_suffix() -> str:
    """Orbax's own temporary-directory suffix where it is importable, else ``ORBAX_TMP_SUFFIX``. Asked for when
    needed, not at import: importing orbax takes about 0.15 s, which ``import es`` need not pay."""
    try:
        from orbax.checkpoint._src.path.atomicity_types import TMP_DIR_SUFFIX
    except ImportError:
        return ORBAX_TMP_SUFFIX
    return TMP_DIR_SUFFIX


@contextlib.contextmanager
def no_persistent_cache_writes():
    """Inside, on this thread, JAX's persistent compilation cache reads as before but writes nothing: its private
    ``config.persistent_cache_min_compile_time_secs`` set to infinity for the block (a no-op without it)."""
    try:
        from jax._src.config import persistent_cache_min_compile_time_secs as min_compile_time
    except ImportError:
        min_compile_time = None
    with min_compile_time(float("inf")) if min_compile_time is not None else contextlib.nullcontext():
        yield


def await_tmp_cleanup(manager: Any) -> None:
    """Finish removing a killed write's temporary directory, which an orbax ``CheckpointManager`` starts in the
    background when it opens (private ``_maybe_await_cleanup_tmp_directory``; a no-op without it)."""
    getattr(manager, "_maybe_await_cleanup_tmp_directory", lambda: None)()


def backends_are_initialized() -> bool | None:
    """Whether JAX has started a backend (``jax._src.xla_bridge``), or ``None`` when it cannot be known."""
    try:
        from jax._src.xla_bridge import backends_are_initialized as initialized
    except ImportError:
        return None
    return bool(initialized())


def cluster_environments() -> list | None:
    """JAX's cluster detectors (``jax._src.clusters.ClusterEnv``: SLURM, Open MPI, Cloud TPU, ...), or ``None``."""
    try:
        from jax._src.clusters import ClusterEnv
    except ImportError:
        return None
    return list(ClusterEnv._cluster_types)


def coordination_client() -> Any:
    """The client of JAX's coordination service (its key-value store and barriers) after
    ``jax.distributed.initialize``: ``jax._src.distributed.global_state.client``."""
    try:
        from jax._src import distributed
    except ImportError as error:
        raise RuntimeError(
            "es needs JAX's coordination service for multi-process agreement, and this JAX version moved it "
            "(jax._src.distributed); use the jax version es supports (see pyproject.toml)."
        ) from error
    return distributed.global_state.client


def optax_aliases() -> list[str]:
    """The optimizers optax defines as aliases (``optax.adam``, ``optax.sgd``, ...): the functions of
    ``optax._src.alias`` that ``optax`` exports, or every exported function whose module is named ``alias``."""
    import inspect

    import optax

    return [name for name in dir(optax) if inspect.isfunction(getattr(optax, name))
            and getattr(optax, name).__module__.rsplit(".", 1)[-1] == "alias"]
