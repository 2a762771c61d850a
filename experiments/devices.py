"""Expose every CPU core as a JAX device, so the population is sharded over all of them."""

from __future__ import annotations

import os


def emulate_cpu_devices(count: int | None = None) -> None:
    """Ask XLA for ``count`` (default ``os.cpu_count()``) CPU devices unless the user already chose.

    Call before JAX creates its backend (the first JAX computation); an
    ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` or
    ``JAX_NUM_CPU_DEVICES=N`` set by the user wins. Accelerator platforms
    are unaffected.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" in flags or "JAX_NUM_CPU_DEVICES" in os.environ:
        return
    count = count or os.cpu_count() or 1
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
