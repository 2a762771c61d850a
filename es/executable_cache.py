"""Compiled programs found on disk by their configuration, without tracing them again.

JAX's persistent compilation cache (``es.compilation_cache``) finds a program by its lowered HLO, so a later
process still traces and lowers every program before it can load it: about 0.3 s for each of ``es.minimize``'s
loop programs on a CPU, against 0.08 s to load the executable itself. Where a program's HLO
is a function of static configuration alone (the loop's: the strategy's program and the params' shapes and
dtypes), this module keeps its serialized executable (``jax.experimental.serialize_executable``) in
``<JAX's cache directory>/es-executables/`` under a key made of that configuration and of everything else
the HLO could depend on (``fingerprint``): es's own source, the versions of Python, jax, jaxlib and numpy,
JAX's configuration, ``XLA_FLAGS``, the devices and the compiler options. A change to any of them is a new
key, so a stale entry is never used.

It is on exactly where JAX's persistent cache is (``es.minimize`` and the training CLI by default;
``ES_COMPILATION_CACHE=off`` leaves both off). A configuration whose text names Python objects by address
(a strategy holding a function, such as an optax optimizer) has no stable key and is always compiled. Only
programs compiled in the process are stored: one that JAX's own cache gave (an entry of an earlier es, say)
is loaded from there as before, traced and lowered first, since XLA cannot serialize it again. An
entry that cannot be read is removed and compiled again; one that cannot be written is skipped: the cache
never fails a call. At most ``MAX_ENTRIES`` entries are kept (least recently used go first). As JAX's own
cache, entries are trusted code (pickles): keep the directory writable by you alone.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pathlib
import pickle
import re
import sys
import tempfile
import threading
import time
from typing import Any, Callable

from es import compat

SUBDIRECTORY = "es-executables"
MAX_ENTRIES = 256
"""Entries kept at most (each about 0.2 to 2 MB); the least recently used are removed beyond it."""
LOAD_EVENT = "/es/executable_cache/load_duration"
"""The ``jax.monitoring`` event of each program loaded here (``fun_name``: the program's name, as JAX's
``backend_compile_duration`` event names it), for whoever counts the programs a call builds."""
_JAX_CACHE_HIT = "/jax/compilation_cache/cache_retrieval_time_sec"
STALE_TEMPORARY_S = 3600.0
"""A temporary file older than this (seconds) was left by a writer that died: it is removed."""
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_CUSTOM_CALL = re.compile(r'custom_call_target="([^"]+)"')
PREPARED_CALLS = ("lapack_",)
"""Prefixes of the custom calls (XLA's calls into libraries) an entry may hold: LAPACK's, whose library jaxlib
binds while it lowers a program that uses it, so a process that loads such a program without lowering
anything binds it first (``_bind_lapack``). A program calling anything else (a host callback, a library bound
some other way) is never stored: its executable could not run in a process that did not lower it."""


def directory() -> pathlib.Path | None:
    """``<jax_compilation_cache_dir>/es-executables``, or ``None`` where JAX's persistent cache is off (and
    in a multi-process job, whose programs span other processes' devices)."""
    import jax

    if not jax.config.jax_enable_compilation_cache or not jax.config.jax_compilation_cache_dir:
        return None
    if jax.process_count() > 1:
        return None
    return pathlib.Path(jax.config.jax_compilation_cache_dir) / SUBDIRECTORY


@functools.cache
def _source_digest() -> str:
    """A digest of es's Python source (this process's: the files do not change under a running program)."""
    root = pathlib.Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def fingerprint() -> str:
    """What a program's HLO and executable could depend on beyond its own configuration, as text."""
    import jax
    import jaxlib
    import numpy as np

    devices = jax.devices()
    parts = (_source_digest(), sys.version_info[:3], jax.__version__, jaxlib.__version__, np.__version__,
             sorted((name, repr(value)) for name, value in jax.config.values.items()),
             str(jax.numpy.result_type(float)), os.environ.get("XLA_FLAGS", ""), devices[0].client.platform_version,
             [(d.platform, d.device_kind, d.id, d.process_index) for d in devices])
    return repr(parts)


def describe(value: Any) -> str:
    """``value`` as text that says all of it: every field of a dataclass (those left out of its ``repr`` too,
    such as CMA-ES's integer margin), named tuples, containers and numpy arrays (by their bytes), with the
    module of each class; ``repr`` for the rest."""
    import numpy as np

    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(f"{f.name}={describe(getattr(value, f.name))}" for f in dataclasses.fields(value))
        return f"{kind}({fields})"
    if isinstance(value, (tuple, list)):
        return f"{kind}({', '.join(describe(item) for item in value)})"
    if isinstance(value, dict):
        return f"{kind}({', '.join(f'{describe(k)}: {describe(v)}' for k, v in value.items())})"
    if isinstance(value, np.ndarray):
        return f"{kind}({value.shape}, {value.dtype}, {hashlib.sha256(value.tobytes()).hexdigest()})"
    return f"{kind}:{value!r}"


def key(configuration: Any) -> str | None:
    """The entry's name for ``configuration`` (``describe``'s text of it must say all that defines the
    program), or ``None`` where that text names an object by address (no stable key)."""
    text = describe(configuration)
    if _ADDRESS.search(text):
        return None
    return hashlib.sha256((text + "\n" + fingerprint()).encode()).hexdigest()


def load(name: str, fun_name: str = ""):
    """The executable stored under ``name``, or ``None`` (absent, or unreadable: then removed); a load records
    ``LOAD_EVENT`` with ``fun_name``."""
    import jax
    from jax.experimental import serialize_executable

    start = time.perf_counter()
    folder = directory()
    if folder is None:
        return None
    path = folder / f"{name}.pkl"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:  # absent, or no such directory
        return None
    try:
        payload, in_tree, out_tree, calls, device_ids = pickle.loads(data)
        if any(call.startswith(PREPARED_CALLS) for call in calls):
            _bind_lapack()
        devices = {device.id: device for device in jax.devices()}
        compiled = serialize_executable.deserialize_and_load(
            payload, in_tree, out_tree, execution_devices=[devices[i] for i in device_ids])
    except Exception:  # damaged, truncated, or from an incompatible build: compiled again
        _remove(path)
        return None
    try:
        os.utime(path)  # recently used
    except OSError:
        pass
    jax.monitoring.record_event_duration_secs(LOAD_EVENT, time.perf_counter() - start, fun_name=fun_name)
    return compiled


def store(name: str, compiled) -> None:
    """Write ``compiled`` under ``name`` (atomically: a reader sees a whole entry or none); skipped quietly
    where the directory cannot be written (a full disk, a read-only directory)."""
    from jax.experimental import serialize_executable

    folder = directory()
    if folder is None:
        return
    try:
        calls = sorted(set(_CUSTOM_CALL.findall(compiled.as_text())))
        if not all(call.startswith(PREPARED_CALLS) for call in calls):
            return
        device_ids = [device.id for device in compiled.runtime_executable().local_devices()]  # in its order
        data = pickle.dumps((*serialize_executable.serialize(compiled), calls, device_ids))
        folder.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    except Exception:  # not serializable (XLA refuses some), or no directory: the call goes on without it
        return
    try:
        with os.fdopen(descriptor, "wb") as f:
            f.write(data)
        os.replace(temporary, folder / f"{name}.pkl")
        _evict(folder)
    except OSError:  # a full disk, a directory made read-only meanwhile
        _remove(pathlib.Path(temporary))


def _remove(path: pathlib.Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


@functools.cache
def _bind_lapack() -> None:
    """Bind jaxlib's LAPACK kernels to their library, as lowering any LAPACK call does (once per process)."""
    import jax
    import numpy as np

    jax.jit(jax.numpy.linalg.eigh).lower(np.eye(2, dtype=np.float32))


def _evict(folder: pathlib.Path) -> None:
    """Keep the ``MAX_ENTRIES`` most recently used entries, and no temporary file a killed writer left."""
    entries = []
    for path in folder.glob("*.pkl"):
        try:
            entries.append((path.stat().st_mtime, path))
        except FileNotFoundError:  # removed by another process meanwhile
            pass
    for _, path in sorted(entries)[: max(0, len(entries) - MAX_ENTRIES)]:
        _remove(path)
    for path in folder.glob(".tmp-*"):
        try:
            if time.time() - path.stat().st_mtime > STALE_TEMPORARY_S:
                _remove(path)
        except FileNotFoundError:
            pass


def load_or_compile(configuration: Any, compile: Callable[[], Any], fun_name: str = ""):
    """The executable of ``configuration`` from the disk if it is there, else ``compile()``'s, stored for
    later processes (unless JAX's own cache gave it: XLA cannot serialize again an executable it loaded; JAX's
    cache is read for it but not written, this entry serving instead: a program that cannot be stored here,
    which calls into a library other than LAPACK, is compiled again by the next process);
    ``fun_name`` names the program in ``LOAD_EVENT``. Safe on any thread."""
    name = key(configuration) if directory() is not None else None
    if name is None:
        return compile()
    compiled = load(name, fun_name)
    if compiled is None:
        with compat.no_persistent_cache_writes():  # stored here: JAX's own copy would cost 0.04 s for nothing
            compiled, from_jax_cache = _compiled_here(compile)
        if not from_jax_cache:
            store(name, compiled)
    return compiled


def _compiled_here(compile: Callable[[], Any]):
    """``(compile(), whether JAX loaded it from its persistent cache)``, told by JAX's event of a cache read,
    which JAX records on the thread that compiles (``_reads``: this call's, on this thread)."""
    _listen_for_jax_cache_reads()
    outer = getattr(_reads, "seen", None)
    _reads.seen = []
    try:
        compiled = compile()
        return compiled, bool(_reads.seen)
    finally:
        if outer is not None:
            outer.extend(_reads.seen)
        _reads.seen = outer


_reads = threading.local()
"""``seen``: while ``_compiled_here`` compiles on a thread, the JAX cache reads recorded on it (else ``None``)."""


@functools.cache
def _listen_for_jax_cache_reads() -> None:
    """One listener for the process, never removed (removing listeners while another thread compiles could make
    JAX skip one of them)."""
    import jax

    def listen(event, duration, **kwargs):
        seen = getattr(_reads, "seen", None)
        if event == _JAX_CACHE_HIT and seen is not None:
            seen.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listen)
