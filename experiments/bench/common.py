"""Helpers shared by the benchmark scripts: child processes, peak RSS, medians, tables."""

from __future__ import annotations

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


def run_child(module: str, args: list[str], timeout: float = 1800, env: dict | None = None) -> dict:
    """Run ``python -m module args`` and parse the JSON its last stdout line holds."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


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
