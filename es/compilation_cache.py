"""JAX's persistent compilation cache: a program compiled once is loaded from disk by every later process.

    es.enable_compilation_cache()                 # any script: one call, before or after JAX has compiled
    ES_COMPILATION_CACHE=/scratch/jax python ...  # another directory
    ES_COMPILATION_CACHE=off python ...           # es.minimize and the training CLI leave it off

A compiled es program (a generation of ``es.evolve``, ``es.tell``'s step, an ``es.minimize`` run's programs)
takes about 0.2 to 3 s to compile on a CPU and about a tenth of that to load. ``es.minimize`` and
``python -m experiments.train`` turn the cache on by default (``enable_by_default``), in ``default_directory()``:
``$ES_COMPILATION_CACHE``, else ``$XDG_CACHE_HOME/es/jax``, else ``~/.cache/es/jax``; they leave alone a cache
directory the user already gave JAX (``jax_compilation_cache_dir``, ``JAX_COMPILATION_CACHE_DIR``). The
cache is JAX's own (keyed by the program, the jax version, the device kind and XLA's flags, so a stale entry
is never used) and holds at most ``MAX_BYTES`` (least recently used entries go first).

Beside it, in ``es-executables/``, ``es.executable_cache`` keeps ``es.minimize``'s loop programs by their
configuration, so that a later process loads them without tracing them first (on and off with this cache).

As JAX warns: the cache is trusted code. Keep it in a directory only you can write.
"""

from __future__ import annotations

import os
import pathlib

ENV = "ES_COMPILATION_CACHE"
"""A directory for the cache, or ``off`` (also ``0``, ``false``, ``no``, empty) to keep it off by default."""
OFF = ("", "0", "off", "false", "no")
MAX_BYTES = 2**31
"""The cache's size at most (2 GiB), where the user has not set ``jax_compilation_cache_max_size``."""
MIN_COMPILE_S = 0.0
"""Programs that compile faster than this are not cached (JAX's default is 1 s, which would leave out most of
es's programs: each ask, tell or small evolve program compiles in well under a second)."""


def default_directory() -> pathlib.Path:
    """``$ES_COMPILATION_CACHE``, else ``$XDG_CACHE_HOME/es/jax``, else ``~/.cache/es/jax``."""
    given = os.environ.get(ENV, "").strip()
    if given and given.lower() not in OFF:
        return pathlib.Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "es" / "jax"


def enable_compilation_cache(directory: str | os.PathLike | None = None) -> pathlib.Path:
    """Turn on JAX's persistent compilation cache in ``directory`` (default: ``default_directory()``).

    Every program compiled after this call is written there, and every later process that turns the cache on
    in the same directory loads it instead of compiling it. Safe to call at any time, and again (the last
    directory wins). Returns the directory.
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache as jax_cache

    if directory is not None and (not isinstance(directory, (str, os.PathLike)) or not str(directory).strip()):
        raise TypeError(
            f"es.enable_compilation_cache(directory={directory!r}): give a directory path (a str or pathlib.Path), "
            f"or nothing for the default ({default_directory()})."
        )
    path = pathlib.Path(directory).expanduser() if directory is not None else default_directory()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"es.enable_compilation_cache(directory={str(path)!r}): cannot create it ({error.strerror}); give a "
            f"writable directory, or set {ENV}=off to leave the cache off."
        ) from None
    if jax.config.jax_compilation_cache_dir != str(path):
        jax_cache.reset_cache()  # JAX opens its cache once, at its first use: open it again in the new directory
        jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
    if jax.config.jax_compilation_cache_max_size == -1:
        jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return path


def environment(directory: str | os.PathLike) -> dict[str, str]:
    """JAX's environment variables that turn the cache on in ``directory`` as ``enable_compilation_cache`` does,
    for child processes that do not call it (``subprocess.run(..., env={**os.environ, **environment(d)})``)."""
    return {"JAX_COMPILATION_CACHE_DIR": str(directory), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": str(MIN_COMPILE_S),
            "JAX_COMPILATION_CACHE_MAX_SIZE": str(MAX_BYTES)}


def enable_by_default() -> pathlib.Path | None:
    """What ``es.minimize`` and the training CLI call: the cache on in ``default_directory()``, unless
    ``$ES_COMPILATION_CACHE`` says ``off`` or the user gave JAX a cache directory of their own (then theirs is
    used as they set it). Returns the directory in use, or ``None`` when the cache stays off. A directory that
    cannot be created leaves the cache off rather than failing the call."""
    import jax

    if os.environ.get(ENV) is not None and os.environ[ENV].strip().lower() in OFF:
        return None
    if jax.config.jax_compilation_cache_dir:
        return pathlib.Path(jax.config.jax_compilation_cache_dir)
    try:
        return enable_compilation_cache()
    except ValueError:
        return None
