"""Device meshes the population is sharded over."""

from __future__ import annotations

import numbers

import jax
from jax.sharding import Mesh

POPULATION_AXIS = "population"

EMULATE_HINT = (
    "To emulate N CPU devices, set XLA_FLAGS=--xla_force_host_platform_device_count=N "
    "(or JAX_NUM_CPU_DEVICES=N, or call jax.config.update('jax_num_cpu_devices', N)) "
    "before JAX is first used."
)


def make_mesh(num_devices: int | None = None) -> Mesh:
    """A 1-D mesh (axis ``"population"``) over the first ``num_devices`` of ``jax.devices()``.

    ``None`` uses every device (of every process, after ``es.distributed.initialize``).
    """
    devices = jax.devices()
    if num_devices is None:
        num_devices = len(devices)
    if isinstance(num_devices, bool) or not isinstance(num_devices, numbers.Integral):
        raise TypeError(f"make_mesh(num_devices={num_devices!r}): num_devices must be an int or None.")
    if num_devices < 1:
        raise ValueError(f"make_mesh(num_devices={num_devices}): num_devices must be >= 1.")
    if num_devices > len(devices):
        raise ValueError(
            f"make_mesh(num_devices={num_devices}): only {len(devices)} "
            f"{devices[0].platform.upper()} device(s) are available. {EMULATE_HINT}"
        )
    return jax.make_mesh((int(num_devices),), (POPULATION_AXIS,), devices=devices[: int(num_devices)])


def resolve_mesh(mesh: Mesh | None) -> Mesh:
    """``mesh``, or a one-device mesh on the default device when ``None``."""
    if mesh is None:
        return make_mesh(1)
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"mesh must be a jax.sharding.Mesh (e.g. es.make_mesh()) or None, got {type(mesh).__name__}."
        )
    return mesh
