"""Device meshes the population is sharded over."""

from __future__ import annotations

import jax
from jax.sharding import Mesh

from es.validation import is_int

POPULATION_AXIS = "population"

EMULATE_HINT = (
    "To emulate N CPU devices, set XLA_FLAGS=--xla_force_host_platform_device_count=N "
    "(or JAX_NUM_CPU_DEVICES=N, or call jax.config.update('jax_num_cpu_devices', N)) "
    "before JAX is first used."
)


def make_mesh(num_devices: int | None = None, popsize: int | None = None) -> Mesh:
    """A 1-D mesh (axis ``"population"``) over ``num_devices`` devices.

    Single process: the first ``num_devices`` of ``jax.devices()``. After
    ``es.distributed.initialize`` with several processes, ``jax.devices()``
    lists every process's devices and the mesh takes ``num_devices /
    num_processes`` devices of each process, in process order, so that every
    process takes part (all processes must call ``evolve`` alike).

    ``num_devices=None`` uses every device (of every process); with
    ``popsize`` it uses the most devices that divide ``popsize`` and are a
    multiple of the number of processes (every process takes part), and a
    given ``num_devices`` must divide ``popsize``. This is the mesh policy of
    ``python -m experiments.train`` (``run.num_devices``).

    The axis is ``AxisType.Auto`` (``jax.make_mesh``'s default is Explicit):
    what ``evolve`` returns, replicated on the mesh, then works in eager code
    with values on one device (``state.params.at[0].set(1.0)``).
    """
    devices = jax.devices()
    if popsize is not None:
        num_devices = _devices_for(popsize, num_devices, len(devices))
    if num_devices is None:
        num_devices = len(devices)
    if not is_int(num_devices):
        raise TypeError(f"make_mesh(num_devices={num_devices!r}): num_devices must be an int or None.")
    if num_devices < 1:
        raise ValueError(f"make_mesh(num_devices={num_devices}): num_devices must be >= 1.")
    if num_devices > len(devices):
        raise ValueError(
            f"make_mesh(num_devices={num_devices}): only {len(devices)} "
            f"{devices[0].platform.upper()} device(s) are available. {EMULATE_HINT}"
        )
    return _mesh(_mesh_devices(devices, int(num_devices)))


def _mesh(devices: list) -> Mesh:
    """The 1-D population mesh over ``devices``, its axis ``Auto`` (``make_mesh``'s docstring): one function for
    ``make_mesh`` and ``mesh=None``, so that ``mesh=None`` and ``make_mesh(1)`` are equal meshes, one program."""
    return jax.make_mesh((len(devices),), (POPULATION_AXIS,), devices=devices, axis_types=(jax.sharding.AxisType.Auto,))


def _devices_for(popsize, num_devices, available: int) -> int:
    """The device count for ``popsize`` members (see ``make_mesh``)."""
    if not is_int(popsize) or popsize < 1:
        raise ValueError(f"make_mesh(popsize={popsize!r}): popsize must be a positive int or None.")
    processes = jax.process_count()
    if num_devices is None:
        counts = [n for n in range(processes, available + 1, processes) if popsize % n == 0]
        if not counts:
            raise ValueError(
                f"make_mesh(popsize={popsize}): the population cannot be split over the {processes} processes of "
                f"this run; use a popsize divisible by {processes}, or fewer processes."
            )
        return max(counts)
    if is_int(num_devices) and num_devices >= 1 and popsize % num_devices:
        raise ValueError(
            f"make_mesh(num_devices={num_devices}, popsize={popsize}): popsize is not divisible by num_devices; "
            f"use a popsize that is a multiple of {num_devices}, or another device count."
        )
    return num_devices


def _mesh_devices(devices: list, num_devices: int) -> list:
    """The first ``num_devices / num_processes`` devices of every process, in process order."""
    processes = sorted({d.process_index for d in devices})
    if len(processes) == 1:
        return devices[:num_devices]
    if num_devices % len(processes):
        raise ValueError(
            f"make_mesh(num_devices={num_devices}): this run has {len(processes)} processes and every "
            f"one must take part, so num_devices must be a multiple of {len(processes)} "
            f"(e.g. {-(-num_devices // len(processes)) * len(processes)}), or None for every device. "
            "For a run on this process alone, use mesh=None."
        )
    per_process = num_devices // len(processes)
    chosen = []
    for process in processes:
        own = sorted((d for d in devices if d.process_index == process), key=lambda d: d.id)
        if per_process > len(own):
            raise ValueError(
                f"make_mesh(num_devices={num_devices}): process {process} has only {len(own)} device(s), "
                f"fewer than the {per_process} per process that {num_devices} devices over "
                f"{len(processes)} processes need."
            )
        chosen += own[:per_process]
    return chosen


def resolve_mesh(mesh: Mesh | None) -> Mesh:
    """``mesh``, or a one-device mesh on this process's default device when ``None``.

    In a multi-process run ``None`` therefore means a process-local run: every
    process computes the whole population on its own device, with no
    communication (and the same results as on any mesh).
    """
    if mesh is None:
        return _mesh(jax.local_devices()[:1])
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"mesh must be a jax.sharding.Mesh (e.g. es.make_mesh()) or None, got {type(mesh).__name__}."
        )
    return mesh
