"""Multi-process runs: one ``es.evolve`` over the devices of many processes.

JAX's multi-controller runtime runs the same program in every process; each
process drives its own (addressable) devices and ``jax.devices()`` lists the
devices of all of them. ``es`` needs nothing more than that::

    import es
    es.distributed.initialize()            # first, before any JAX computation
    mesh = es.make_mesh()                  # every device of every process
    state = strategy.init(jax.random.key(0), params)   # the same on every process
    state, metrics = es.evolve(strategy, fitness_fn, state, 100, mesh=mesh)
    if es.distributed.is_writer():         # process 0 writes logs/checkpoints
        print(es.distributed.fetch(metrics)["fitness_mean"][-1])

``initialize`` takes its configuration from, in order: its arguments; the
``ES_*`` environment variables that ``python -m es.launch`` sets; JAX's
cluster auto-detection (SLURM, Open MPI, Cloud TPU). With none of
them (a plain single process) it does nothing, so the same script runs
unchanged on one process, under ``es.launch`` and under ``srun``.

Only the fitness all-gather of each generation (``popsize`` float32 scalars,
plus the per-member statistics of an ``es.StatefulFitness``) crosses
processes; see ``docs/distributed.md``. The arrays of such a run (``replicate``, ``fetch``, ``local_copy``)
are ``es.parallel.global_arrays``'s, public here.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import threading
from typing import Any, Callable, NamedTuple

import jax

from es import compat
from es.parallel.global_arrays import fetch, local_copy, replicate  # public here, as es.distributed.*
from es.validation import is_int

PyTree = Any

__all__ = [
    "AGREEMENT_TIMEOUT_S", "AUTO_DETECTED_CLUSTERS", "CONNECTED", "DEFAULT_HEARTBEAT_TIMEOUT",
    "DEFAULT_INITIALIZATION_TIMEOUT", "DEFAULT_SHUTDOWN_TIMEOUT", "ENV_COORDINATOR_ADDRESS",
    "ENV_COORDINATOR_BIND_ADDRESS", "ENV_HEARTBEAT_TIMEOUT", "ENV_INITIALIZATION_TIMEOUT", "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID", "ENV_SHUTDOWN_TIMEOUT", "INITIALIZING", "STOPPABLE", "STOP_SIGNALS", "ProcessGroup",
    "add_stage_hook", "agree_on_outcome", "all_processes", "announce", "detected_cluster", "fetch", "initialize",
    "is_writer", "local_copy", "process_count", "process_index", "replicate",
]

# Environment variables set by ``python -m es.launch`` (read by ``initialize``).
ENV_COORDINATOR_ADDRESS = "ES_COORDINATOR_ADDRESS"  # "host:port" of process 0's coordinator
ENV_COORDINATOR_BIND_ADDRESS = "ES_COORDINATOR_BIND_ADDRESS"  # where process 0 listens
ENV_NUM_PROCESSES = "ES_NUM_PROCESSES"
ENV_PROCESS_ID = "ES_PROCESS_ID"
ENV_INITIALIZATION_TIMEOUT = "ES_INITIALIZATION_TIMEOUT"  # seconds for every process to connect
ENV_HEARTBEAT_TIMEOUT = "ES_HEARTBEAT_TIMEOUT"  # seconds without heartbeat before a peer counts as dead
ENV_SHUTDOWN_TIMEOUT = "ES_SHUTDOWN_TIMEOUT"  # seconds a finished process waits for the others at exit

# JAX cluster detectors tried by default: they read only the environment (or TPU metadata on TPU VMs).
AUTO_DETECTED_CLUSTERS = ("slurm", "ompi", "gcetpu", "gketpu")

# JAX's own defaults, used when neither arguments nor es.launch give a value.
DEFAULT_INITIALIZATION_TIMEOUT = 300
DEFAULT_HEARTBEAT_TIMEOUT = 100
DEFAULT_SHUTDOWN_TIMEOUT = 300


class ProcessGroup(NamedTuple):
    """The processes of this run, as ``initialize`` set them up.

    Attributes:
      process_id: this process's rank, ``0 .. num_processes - 1``.
      num_processes: how many processes take part (1: a plain single process).
      coordinator_address: ``"host:port"`` of process 0's coordinator (``None``
        when single-process or auto-detected).
      source: where the configuration came from: ``"arguments"``,
        ``"es.launch"`` (environment), ``"cluster"`` (JAX auto-detection, e.g.
        SLURM), ``"jax"`` (``jax.distributed`` was already initialized) or
        ``"single process"``.
    """

    process_id: int
    num_processes: int
    coordinator_address: str | None
    source: str


# --------------------------------------------------------------------------- initialize


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    initialization_timeout: int | None = None,
    heartbeat_timeout: int | None = None,
    shutdown_timeout: int | None = None,
    coordinator_bind_address: str | None = None,
    local_device_ids: int | list[int] | None = None,
    cluster_detection: bool | str = True,
) -> ProcessGroup:
    """Join this process to a multi-process run (``jax.distributed.initialize``).

    Call it once, before any JAX computation (creating arrays, ``jax.devices()``).
    Safe to call when JAX is already initialized for multiple processes (it
    then only reports the group).

    Args:
      coordinator_address: ``"host:port"`` where process 0 serves the
        coordinator; give it with ``num_processes`` and ``process_id``, or none
        of the three.
      num_processes: total number of processes (>= 1; 1 does nothing).
      process_id: this process's rank in ``[0, num_processes)``.
      initialization_timeout: seconds every process may take to connect before
        the run fails (JAX default 300; ``es.launch`` sets 60).
      heartbeat_timeout: seconds without a heartbeat after which a process
        counts as dead and every other process aborts (JAX default 100;
        ``es.launch`` sets 20).
      shutdown_timeout: seconds a finished process waits at exit for the
        others (JAX default 300; ``es.launch`` sets 30).
      coordinator_bind_address: where process 0 listens. Default: the
        coordinator address itself when it is a loopback address (nothing
        outside this machine can connect), else every interface on its port.
      local_device_ids: restrict this process to these local accelerator ids
        (e.g. one GPU per process); ``None`` keeps every local device.
      cluster_detection: with no arguments and no ``es.launch`` environment,
        ``True`` lets JAX detect SLURM (inside ``srun``), Open MPI and Cloud
        TPU from the environment; ``False`` skips detection; a JAX
        ``cluster_detection_method`` name (e.g. ``"mpi4py"``) uses that one.

    Returns:
      the ``ProcessGroup`` this process belongs to.
    """
    _check_timeouts(initialization_timeout, heartbeat_timeout, shutdown_timeout)
    methods = _check_cluster_detection(cluster_detection)
    if jax.distributed.is_initialized():
        return ProcessGroup(jax.process_index(), jax.process_count(), None, "jax")

    method = None
    if any(value is not None for value in (coordinator_address, num_processes, process_id)):
        source = "arguments"
        coordinator_address, num_processes, process_id = _check_explicit(
            coordinator_address, num_processes, process_id
        )
    elif os.environ.get(ENV_NUM_PROCESSES) is not None:
        source = "es.launch"
        coordinator_address, num_processes, process_id = _from_environment()
        coordinator_bind_address = coordinator_bind_address or os.environ.get(ENV_COORDINATOR_BIND_ADDRESS)
    elif methods and (cluster := detected_cluster(methods)) is not None:
        source = "cluster"
        method, num_processes = cluster
    else:
        num_processes = 1
    if num_processes == 1:
        return ProcessGroup(0, 1, None, "single process")

    if coordinator_bind_address is None and coordinator_address is not None and _is_loopback(coordinator_address):
        coordinator_bind_address = coordinator_address
    _check_backend_not_started()
    announce(INITIALIZING)
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=local_device_ids,
        cluster_detection_method=method if source == "cluster" else "deactivate",
        coordinator_bind_address=coordinator_bind_address,
        initialization_timeout=_timeout(
            initialization_timeout, ENV_INITIALIZATION_TIMEOUT, DEFAULT_INITIALIZATION_TIMEOUT
        ),
        heartbeat_timeout_seconds=_timeout(heartbeat_timeout, ENV_HEARTBEAT_TIMEOUT, DEFAULT_HEARTBEAT_TIMEOUT),
        shutdown_timeout_seconds=_timeout(shutdown_timeout, ENV_SHUTDOWN_TIMEOUT, DEFAULT_SHUTDOWN_TIMEOUT),
    )
    announce(CONNECTED)
    return ProcessGroup(jax.process_index(), jax.process_count(), coordinator_address, source)


def _check_cluster_detection(cluster_detection) -> tuple[str, ...]:
    if cluster_detection is True:
        return AUTO_DETECTED_CLUSTERS
    if cluster_detection is False:
        return ()
    if isinstance(cluster_detection, str) and cluster_detection:
        return (cluster_detection,)
    raise TypeError(
        f"es.distributed.initialize(cluster_detection={cluster_detection!r}): use True (SLURM, Open MPI, "
        "Cloud TPU), False, or one of JAX's cluster_detection_method names such as 'mpi4py'."
    )


def _check_backend_not_started() -> None:
    if compat.backends_are_initialized():  # None (unknown): jax.distributed.initialize checks it too
        raise RuntimeError(
            "es.distributed.initialize() must run before any JAX computation (creating an array, "
            "jax.devices(), jax.random.key, ...): call it right after the imports, at the top of the script."
        )


def detected_cluster(methods: tuple[str, ...] = AUTO_DETECTED_CLUSTERS) -> tuple[str, int] | None:
    """``(method, num_processes)`` of the cluster JAX detects from the environment, or ``None``.

    ``method`` is JAX's ``cluster_detection_method`` name (``"slurm"`` inside
    ``srun``, ``"ompi"`` under Open MPI's ``mpirun``, ``"gcetpu"``/``"gketpu"``
    on Cloud TPU). Starts nothing. Other JAX detectors (``"mpi4py"``) are
    tried only when named in ``methods``.
    """
    environments = compat.cluster_environments()
    if environments is None:  # JAX moved its private cluster API: read the common launchers' variables
        return _detected_from_variables(methods)
    for env in environments:
        if env.name not in methods:
            continue
        try:
            if env.is_env_present():
                return env.name, int(env.get_process_count())
        except Exception:  # a detector that cannot run here
            continue
    return None


def _detected_from_variables(methods) -> tuple[str, int] | None:
    if "slurm" in methods and all(v in os.environ for v in ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_PROCID")):
        return "slurm", int(os.environ["SLURM_NTASKS"])
    if "ompi" in methods and "OMPI_COMM_WORLD_SIZE" in os.environ:
        return "ompi", int(os.environ["OMPI_COMM_WORLD_SIZE"])
    return None


def _check_explicit(coordinator_address, num_processes, process_id) -> tuple[str, int, int]:
    missing = [
        name
        for name, value in (
            ("coordinator_address", coordinator_address),
            ("num_processes", num_processes),
            ("process_id", process_id),
        )
        if value is None
    ]
    if missing:
        raise ValueError(
            f"es.distributed.initialize: {', '.join(missing)} missing; give coordinator_address, "
            "num_processes and process_id together (or none of them, to read them from es.launch's "
            "environment or the cluster)."
        )
    _check_address(coordinator_address, "coordinator_address")
    if not is_int(num_processes) or num_processes < 1:
        raise ValueError(f"es.distributed.initialize(num_processes={num_processes!r}): must be an int >= 1.")
    if not is_int(process_id) or not 0 <= process_id < num_processes:
        raise ValueError(
            f"es.distributed.initialize(process_id={process_id!r}): must be an int in "
            f"[0, {num_processes}) for num_processes={num_processes}."
        )
    return coordinator_address, int(num_processes), int(process_id)


def _from_environment() -> tuple[str, int, int]:
    values = {}
    for name in (ENV_COORDINATOR_ADDRESS, ENV_NUM_PROCESSES, ENV_PROCESS_ID):
        value = os.environ.get(name)
        if value is None:
            raise ValueError(
                f"es.distributed.initialize: {ENV_NUM_PROCESSES} is set but {name} is not; run the "
                "script with python -m es.launch, which sets all of them, or unset ES_NUM_PROCESSES."
            )
        values[name] = value
    try:
        num_processes = int(values[ENV_NUM_PROCESSES])
        process_id = int(values[ENV_PROCESS_ID])
    except ValueError:
        raise ValueError(
            f"es.distributed.initialize: {ENV_NUM_PROCESSES}={values[ENV_NUM_PROCESSES]!r} and "
            f"{ENV_PROCESS_ID}={values[ENV_PROCESS_ID]!r} must be integers."
        ) from None
    return _check_explicit(values[ENV_COORDINATOR_ADDRESS], num_processes, process_id)


def _check_address(address, name: str) -> None:
    host, _, port = str(address).rpartition(":") if isinstance(address, str) else ("", "", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"es.distributed.initialize({name}={address!r}): expected 'host:port', e.g. '10.0.0.1:1234' "
            "(process 0's address and a free port)."
        )


def _is_loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_timeouts(*timeouts) -> None:
    names = ("initialization_timeout", "heartbeat_timeout", "shutdown_timeout")
    for name, value in zip(names, timeouts):
        if value is not None and (not is_int(value) or value < 1):
            raise ValueError(f"es.distributed.initialize({name}={value!r}): must be a whole number of seconds >= 1.")


def _timeout(value: int | None, env_name: str, default: int) -> int:
    if value is not None:
        return int(value)
    text = os.environ.get(env_name)
    if text is None:
        return default
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"es.distributed.initialize: {env_name}={text!r} must be a whole number of seconds >= 1.")
    return int(text)


# The signals that stop an ``es.run`` after the segment in progress; ``es.launch`` passes them on to its ranks.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


# The stages a process announces to whoever supervises it (``announce``): ``es.launch`` registers the hook
# that records them (``es/parallel/launch.py``: which ranks reached ``initialize``, which stop cleanly on a signal).
INITIALIZING = "initializing"  # about to join the other processes
CONNECTED = "connected"  # joined them
STOPPABLE = "stoppable"  # SIGTERM/SIGINT now finish the segment in progress and checkpoint (es.run's handlers)

_stage_hooks: list[Callable[[str], None]] = []


def add_stage_hook(hook: Callable[[str], None]) -> None:
    """Call ``hook(stage)`` whenever this process ``announce``s a stage."""
    if hook not in _stage_hooks:
        _stage_hooks.append(hook)


def announce(stage: str) -> None:
    """Tell whoever supervises this process (the hooks of ``add_stage_hook``) that it reached ``stage``."""
    for hook in _stage_hooks:
        hook(stage)


# --------------------------------------------------------------------------- who am I


def process_index() -> int:
    """This process's rank (0 in a single-process run). Starts no JAX backend before ``initialize``."""
    return jax.process_index() if jax.distributed.is_initialized() else 0


def process_count() -> int:
    """How many processes take part (1 in a single-process run). Starts no JAX backend before ``initialize``."""
    return jax.process_count() if jax.distributed.is_initialized() else 1


def is_writer() -> bool:
    """Whether this process writes logs, checkpoints and plots: process 0 only.

    Every process runs the same computation and holds the same replicated
    results, so exactly one of them writes.
    """
    return process_index() == 0


# --------------------------------------------------------------------------- host agreement

# How long a process waits in ``all_processes`` for the others (they may be a whole segment behind).
# A dead peer does not make it wait this long: JAX's heartbeats end the job first.
AGREEMENT_TIMEOUT_S = 24 * 3600


def all_processes(name: str, value: str = "") -> list[str]:
    """Every process's ``value`` for ``name``, in process order (``[value]`` in a single process).

    A barrier that also exchanges one short string per process, through JAX's
    coordination service (its key-value store, over the network to process
    0): host-only, so it neither waits for nor reorders device work. Every
    process must call it with the same ``name``, and each ``name`` once per
    run of the job. Raises ``RuntimeError`` after ``AGREEMENT_TIMEOUT_S`` seconds.
    The wait runs on a helper thread while this one waits in short steps, so a
    signal's handler (``es.run``'s second Ctrl-C) still acts while a peer is late.
    """
    if process_count() == 1:
        return [value]
    client = compat.coordination_client()
    rank, count = process_index(), process_count()
    prefix = f"es/{name}/"
    outcome: dict = {}

    def exchange():
        try:
            client.key_value_set(f"{prefix}{rank}", value)
            client.wait_at_barrier(f"es-barrier/{name}", int(AGREEMENT_TIMEOUT_S * 1000))
            outcome["entries"] = dict(client.key_value_dir_get(prefix))
        except Exception as error:  # jaxlib raises its own runtime error types
            outcome["error"] = error

    waiting = threading.Thread(target=exchange, name=f"es.distributed {name}", daemon=True)
    waiting.start()
    while waiting.is_alive():
        waiting.join(0.05)
    if "error" in outcome:
        raise RuntimeError(
            f"es.distributed.all_processes({name!r}): the {count} processes did not all arrive within "
            f"{AGREEMENT_TIMEOUT_S:g} s, or one of them failed: {outcome['error']}"
        ) from outcome["error"]
    entries = outcome["entries"]
    return [entries[f"{prefix}{r}"] for r in range(count)]


def agree_on_outcome(name: str, step: Callable[[], Any], summary: Callable[[Any], str] = lambda value: "",
                     peer_failed: Callable[[int, str], Exception] | None = None) -> tuple[Any, list[str]]:
    """Run ``step()`` on every process and exchange how it went: ``(its value, every process's summary)``.

    The pattern of a step that may fail on some processes only (reading a checkpoint, opening a directory):
    every process reaches the exchange whatever happened, so none waits for one that will never come. A
    process whose step raised re-raises its own error after the exchange; the others raise
    ``peer_failed(process, "<ErrorType>: <message>")`` for the first process that failed (default: a
    ``RuntimeError`` naming it). ``summary(value)`` is what a process tells the others when its step
    succeeded (one short string; e.g. where it will resume); the summaries come back in process order.
    """
    try:
        value = step()
        outcome = f"ok {summary(value)}"
    except Exception as error:  # whatever the step raises: every process must reach the exchange
        value, outcome = error, f"error {type(error).__name__}: {error}"
    everyone = all_processes(name, outcome)
    if isinstance(value, Exception):
        raise value
    failed = [(p, text[len("error "):]) for p, text in enumerate(everyone) if text.startswith("error ")]
    if failed:
        process, text = failed[0]
        raise (peer_failed or _peer_failed)(process, text)
    return value, [text[len("ok "):] for text in everyone]


def _peer_failed(process: int, text: str) -> Exception:
    return RuntimeError(f"process {process} failed: {text}")

