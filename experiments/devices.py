"""Expose every CPU core as a JAX device, so the population is sharded over all of them."""

from __future__ import annotations

import os

from es.parallel.distributed import ENV_NUM_PROCESSES


def emulate_cpu_devices(count: int | None = None) -> None:
    """Ask XLA for ``count`` CPU devices unless the user (or ``es.launch``) already chose.

    ``count`` defaults to the cores this process may run on (its CPU
    affinity: all of them, or those ``srun --cpu-bind`` or ``taskset`` gave
    it). Call before JAX creates its backend (the first JAX computation); an
    ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` or
    ``JAX_NUM_CPU_DEVICES=N`` set by the user wins, and under
    ``python -m es.launch`` the launcher decides (``--devices-per-process M``,
    else JAX's default of one device per process). Accelerator platforms are
    unaffected.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" in flags or "JAX_NUM_CPU_DEVICES" in os.environ:
        return
    if ENV_NUM_PROCESSES in os.environ:  # es.launch: its --devices-per-process (or JAX's one device) wins
        return
    if count is None:
        count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
