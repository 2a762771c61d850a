"""Helpers shared by the benchmark scripts: child processes, peak RSS, medians, tables."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from typing import Callable


def peak_rss_bytes() -> int:
    """This process's peak resident set size in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_command(command: list[str], timeout: float, env: dict | None = None, prefix: str = "") -> dict:
    """Run ``command`` and parse the JSON of its last stdout line that starts with ``prefix + "{"``.

    ``env`` adds to this process's environment. A timeout, a non-zero exit or no JSON line gives
    ``{"error": ...}`` with the tail of stderr instead.
    """
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line.removeprefix(prefix) for line in proc.stdout.splitlines() if line.startswith(prefix + "{")]
    if proc.returncode != 0 or not lines:
        tail = " | ".join(line for line in proc.stderr.strip().splitlines()[-3:] if line.strip())
        return {"error": f"exit {proc.returncode}{'' if lines else ', no JSON result'}: {tail[-300:]}"}
    return json.loads(lines[-1])


def run_child(module: str, args: list[str], timeout: float = 1800, env: dict | None = None) -> dict:
    """Run ``python -m module args`` and parse the JSON of its last stdout line that starts with ``{`` (see run_command)."""
    return run_command([sys.executable, "-m", module, *args], timeout, env)


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls of ``fn`` (which must block until done)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine_description() -> str:
    """CPU model, core count and memory of this machine, plus Python and JAX versions."""
    import jax

    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem_gib:.0f} GiB RAM; Python {platform.python_version()}, "
        f"jax {jax.__version__}, backend {jax.default_backend()} ({jax.devices()[0].device_kind})"
    )


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(out: str, rows: list[dict], text: str, extra: dict | None = None) -> None:
    """Print ``text`` (a markdown table) and write ``out`` (JSON: the machine, ``rows`` and ``extra``'s keys)
    and ``out``'s ``.md``."""
    print()
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"machine": machine_description(), "rows": rows, **(extra or {})}, f, indent=1)
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write(text + "\n")


def use_compilation_cache(directory: str | None) -> None:
    """Turn on JAX's persistent compilation cache in ``directory`` (every program, however quick its compile),
    so that another process with the same directory loads the compiled programs; ``None``: leave it off."""
    if directory:
        import jax

        jax.config.update("jax_compilation_cache_dir", directory)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


class CompileClock:
    """Seconds JAX spends tracing, lowering to MLIR and compiling, while active (``jax.monitoring`` events)."""

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration")

    def __init__(self):
        self.seconds = 0.0
        self.compiles = 0
        self.active = False

    def _listen(self, event: str, duration: float, **_) -> None:
        if self.active and event in self.EVENTS:
            self.seconds += duration
            self.compiles += event == self.EVENTS[-1]

    def __enter__(self):
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc):
        import jax.monitoring

        jax.monitoring.unregister_event_duration_listener(self._listen)

    @contextlib.contextmanager
    def measuring(self):
        self.active = True
        try:
            yield
        finally:
            self.active = False
