"""Run one command as N processes of a multi-process JAX run on this machine.

    python -m es.launch --processes 2 --devices-per-process 2 -- python my_es_script.py --flag

Each process gets the ``ES_*`` environment that ``es.distributed.initialize()``
reads (coordinator on 127.0.0.1, bound to loopback only, on a free port; its
rank; timeouts), so the script itself needs no flags. Every output line is
prefixed with its rank (``[rank 1] ...``).

The job never hangs on a failed process:

- a rank that exits non-zero or is killed ends the job: the launcher names
  it, stops the others (SIGTERM, then SIGKILL after ``--kill-grace`` seconds)
  and exits with that rank's code (128 + signal for a signal) within about
  ``--kill-grace`` + 0.1 seconds;
- a rank that never reaches ``es.distributed.initialize`` while the others
  wait for it: after ``--initialization-timeout`` seconds the launcher names
  it and ends the job (JAX's own connection timeout is the same);
- a rank that stops responding (frozen, its machine gone): JAX aborts the
  others after ``--heartbeat-timeout`` seconds without a heartbeat;
- anything else (e.g. a rank stuck in an endless Python loop): ``--timeout``.

SIGTERM or Ctrl-C (SIGINT) to the launcher is passed on, once, to every rank
(the ranks run in their own process group, so a terminal's Ctrl-C reaches
them only through the launcher). Ranks inside ``es.run`` finish the segment in
progress, process 0 checkpoints it, and they exit; the launcher waits up to
``--stop-timeout`` seconds for that (``--kill-grace`` if some rank is not in
``es.run``, where JAX's own SIGTERM handler would ignore the signal), then
sends SIGKILL. A second signal to the launcher sends SIGKILL at once. It exits
0 if every rank did, else 128 + the signal (143 or 130). If the launcher
itself is killed, the ranks get SIGKILL from the kernel (``PR_SET_PDEATHSIG``).

Pass ``--cpus-per-process K`` to pin each process to its own K cores (CPU
affinity, and ``NPROC=K`` for XLA's thread pools), so that XLA's intra-op
threads of different processes do not compete for the same cores.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from es.parallel import distributed

POLL_SECONDS = 0.1
DEFAULT_INITIALIZATION_TIMEOUT = 60
DEFAULT_HEARTBEAT_TIMEOUT = 20
DEFAULT_SHUTDOWN_TIMEOUT = 30
DEFAULT_KILL_GRACE = 5.0
DEFAULT_STOP_TIMEOUT = 60.0
PR_SET_PDEATHSIG = 1
ENV_LAUNCH_DIR = "ES_LAUNCH_DIR"  # the marker directory of the ranks' stages (set for every rank)


def write_marker(stage: str) -> None:
    """In a rank: record that it reached ``stage`` (``es.distributed.announce``), as ``<stage>.<rank>`` in
    ``ES_LAUNCH_DIR``; nothing outside ``es.launch``. The launcher reads them with ``markers_written``."""
    directory = os.environ.get(ENV_LAUNCH_DIR)
    if directory and os.path.isdir(directory):
        with open(os.path.join(directory, f"{stage}.{os.environ.get(distributed.ENV_PROCESS_ID, '0')}"), "w"):
            pass


distributed.add_stage_hook(write_marker)  # registered wherever es is imported: es.parallel imports this module


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_environment(args: argparse.Namespace, rank: int, port: int, marker_dir: str) -> dict[str, str]:
    """The environment of process ``rank``: ours on top of the launcher's."""
    address = f"127.0.0.1:{port}"
    env = dict(os.environ)
    env.update({
        distributed.ENV_COORDINATOR_ADDRESS: address,
        distributed.ENV_COORDINATOR_BIND_ADDRESS: address,
        distributed.ENV_NUM_PROCESSES: str(args.processes),
        distributed.ENV_PROCESS_ID: str(rank),
        distributed.ENV_INITIALIZATION_TIMEOUT: str(args.initialization_timeout),
        distributed.ENV_HEARTBEAT_TIMEOUT: str(args.heartbeat_timeout),
        distributed.ENV_SHUTDOWN_TIMEOUT: str(args.shutdown_timeout),
        ENV_LAUNCH_DIR: marker_dir,
        "PYTHONUNBUFFERED": "1",
    })
    if args.devices_per_process is not None:
        env["JAX_NUM_CPU_DEVICES"] = str(args.devices_per_process)
    if args.cpus_per_process is not None:
        env["NPROC"] = str(args.cpus_per_process)
    return env


def rank_cpus(rank: int, cpus_per_process: int | None) -> list[int] | None:
    """The cores process ``rank`` is pinned to: its own block of ``cpus_per_process``."""
    if cpus_per_process is None:
        return None
    available = sorted(os.sched_getaffinity(0))
    start = rank * cpus_per_process
    return [available[(start + i) % len(available)] for i in range(cpus_per_process)]


def _child_setup(cpus: list[int] | None):
    """Runs in the child before exec: own process group; die with the launcher; pin to ``cpus``."""

    def setup():
        os.setpgid(0, 0)  # a terminal's Ctrl-C reaches the launcher only, which passes it on once
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return setup


_LINE_END = re.compile(rb"\r\n|\r|\n")


def _pump(stream, out, prefix: bytes, lock: threading.Lock) -> None:
    """Copy ``stream`` to ``out`` line by line, each line prefixed with its rank.

    A line ends at ``\n`` or at ``\r`` (a progress bar redrawing itself), and is written whole, so the
    lines of different ranks never mix.
    """
    pending = b""
    while True:
        chunk = stream.read1(65536)
        pending += chunk
        lines = []
        while (match := _LINE_END.search(pending)) and (match.end() < len(pending) or not chunk
                                                         or match.group() != b"\r"):
            lines.append(prefix + pending[:match.end()])  # a lone "\r" at the end may be half of "\r\n"
            pending = pending[match.end():]
        if not chunk and pending:
            lines.append(prefix + pending + b"\n")
            pending = b""
        if lines:
            with lock:
                out.write(b"".join(lines))
                out.flush()
        if not chunk:
            break
    stream.close()


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def exit_status(code: int) -> int:
    """The launcher's exit status for a rank's return code (128 + n for signal n)."""
    return 128 - code if code < 0 else code


def markers_written(marker_dir: str, stage: str, processes: int) -> set[int]:
    """The ranks that have written their ``stage`` marker (``distributed.INITIALIZING``, ``CONNECTED``,
    ``STOPPABLE``) in ``marker_dir`` (``write_marker`` writes them as a rank announces them)."""
    return {rank for rank in range(processes) if os.path.exists(os.path.join(marker_dir, f"{stage}.{rank}"))}


def _stop(procs: list[subprocess.Popen], grace: float) -> None:
    """SIGTERM every live rank, then SIGKILL whatever is left after ``grace`` seconds."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
    for proc in procs:
        proc.wait()


class Signals:
    """The SIGTERM/SIGINT the launcher received, in order (handlers only record them)."""

    def __init__(self):
        self.received: list[int] = []
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in distributed.STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._record)

    def _record(self, signum, frame):
        self.received.append(signum)

    def restore(self):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def launch(args: argparse.Namespace) -> int:
    """Start the ranks, relay their output, and return the job's exit status."""
    signals = Signals()
    try:
        return _launch(args, signals)
    finally:
        signals.restore()


def _launch(args: argparse.Namespace, signals: Signals) -> int:
    port = args.port or free_loopback_port()
    lock = threading.Lock()
    say = lambda message: _say(lock, message)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="es-launch-") as marker_dir:
        procs = []
        try:
            for rank in range(args.processes):
                procs.append(subprocess.Popen(
                    args.command,
                    env=rank_environment(args, rank, port, marker_dir),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    preexec_fn=_child_setup(rank_cpus(rank, args.cpus_per_process)),
                ))
        except OSError as error:
            say(f"es.launch: cannot start {args.command[0]!r}: {error}")
            _stop(procs, args.kill_grace)
            return 127
        # Output threads start only once every child exists (preexec_fn and threads do not mix).
        pumps = []
        for rank, proc in enumerate(procs):
            prefix = f"[rank {rank}] ".encode()
            for stream, out in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer)):
                pump = threading.Thread(target=_pump, args=(stream, out, prefix, lock), daemon=True)
                pump.start()
                pumps.append(pump)
        status = supervise(args, procs, marker_dir, say, signals)
        for pump in pumps:
            pump.join(timeout=2.0)
    return status


def _say(lock: threading.Lock, message: str) -> None:
    with lock:
        sys.stderr.buffer.write(message.encode() + b"\n")
        sys.stderr.buffer.flush()


def supervise(args, procs, marker_dir, say, signals) -> int:
    """Poll the ranks ``procs`` until the job ends; its exit status. The first rank to fail, a rank that has not
    reached ``es.distributed.initialize`` within ``args.initialization_timeout``, ``args.timeout`` or a signal
    in ``signals`` (a ``Signals``) stops the others; ``say`` reports why."""
    start = time.monotonic()
    first_initializing = None
    while True:
        if signals.received:
            return _pass_on_stop(args, procs, marker_dir, say, signals)
        codes = [proc.poll() for proc in procs]
        failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            rank = failed[0]
            started = markers_written(marker_dir, distributed.INITIALIZING, args.processes)
            missing = sorted(set(range(args.processes)) - started)
            note = ""
            if missing and len(missing) < args.processes:
                note = f" (rank(s) {missing} never reached es.distributed.initialize)"
            say(f"es.launch: rank {rank} (pid {procs[rank].pid}) {describe_exit(codes[rank])}{note}; "
                f"stopping the other {sum(c is None for c in codes)} process(es).")
            _stop(procs, args.kill_grace)
            return exit_status(codes[rank])
        if all(code == 0 for code in codes):
            return 0
        now = time.monotonic()
        if first_initializing != float("inf"):  # until every rank has connected
            started = markers_written(marker_dir, distributed.INITIALIZING, args.processes)
            if started and first_initializing is None:
                first_initializing = now
            if first_initializing is not None and now - first_initializing > args.initialization_timeout + 5:
                connected = markers_written(marker_dir, distributed.CONNECTED, args.processes)
                if len(connected) < args.processes:
                    missing = sorted(set(range(args.processes)) - started)
                    who = f"rank(s) {missing} never reached" if missing else "not every rank completed"
                    say(f"es.launch: {who} es.distributed.initialize within "
                        f"{args.initialization_timeout} s; stopping all {args.processes} processes.")
                    _stop(procs, args.kill_grace)
                    return 1
                first_initializing = float("inf")  # everyone connected: no more checks
        if args.timeout is not None and now - start > args.timeout:
            running = [rank for rank, code in enumerate(codes) if code is None]
            say(f"es.launch: --timeout {args.timeout} s reached with rank(s) {running} still running; "
                "stopping them.")
            _stop(procs, args.kill_grace)
            return 124
        time.sleep(POLL_SECONDS)


def _pass_on_stop(args, procs, marker_dir, say, signals) -> int:
    """Send the launcher's first SIGTERM/SIGINT to every rank once; wait for them; SIGKILL what is left."""
    signum = signals.received[0]
    live = [rank for rank, proc in enumerate(procs) if proc.poll() is None]
    stoppable = markers_written(marker_dir, distributed.STOPPABLE, args.processes)
    wait = args.stop_timeout if set(live) <= stoppable else args.kill_grace
    how = ("they finish their es.run segment and checkpoint" if set(live) <= stoppable
           else "not every rank is in es.run")
    say(f"es.launch: received {signal.Signals(signum).name}; passing it on to rank(s) {live} ({how}; "
        f"SIGKILL after {wait:g} s, or at once on a second signal).")
    for rank in live:
        try:
            os.kill(procs[rank].pid, signum)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait
    while any(proc.poll() is None for proc in procs):
        if len(signals.received) > 1 or time.monotonic() > deadline:
            left = [rank for rank, proc in enumerate(procs) if proc.poll() is None]
            why = "a second signal" if len(signals.received) > 1 else f"still running after {wait:g} s"
            say(f"es.launch: {why}: SIGKILL to rank(s) {left}.")
            for rank in left:
                procs[rank].kill()
            break
        time.sleep(POLL_SECONDS)
    codes = [proc.wait() for proc in procs]
    return 0 if all(code == 0 for code in codes) else 128 + signum


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m es.launch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--processes", "-n", type=_positive_int, required=True, help="number of processes N")
    parser.add_argument("--devices-per-process", type=_positive_int, default=None,
                        help="CPU devices each process exposes (sets JAX_NUM_CPU_DEVICES); default: JAX's own")
    parser.add_argument("--cpus-per-process", type=_positive_int, default=None,
                        help="pin each process to its own block of K cores (affinity and NPROC=K)")
    parser.add_argument("--initialization-timeout", type=_positive_int, default=DEFAULT_INITIALIZATION_TIMEOUT,
                        help="seconds for every rank to connect (default %(default)s)")
    parser.add_argument("--heartbeat-timeout", type=_positive_int, default=DEFAULT_HEARTBEAT_TIMEOUT,
                        help="seconds without heartbeat before JAX declares a rank dead (default %(default)s)")
    parser.add_argument("--shutdown-timeout", type=_positive_int, default=DEFAULT_SHUTDOWN_TIMEOUT,
                        help="seconds a finished rank waits for the others at exit (default %(default)s)")
    parser.add_argument("--kill-grace", type=_positive_float, default=DEFAULT_KILL_GRACE,
                        help="seconds between SIGTERM and SIGKILL when stopping ranks (default %(default)s)")
    parser.add_argument("--stop-timeout", type=_positive_float, default=DEFAULT_STOP_TIMEOUT,
                        help="seconds ranks in es.run get to checkpoint and exit after the launcher passes on "
                             "SIGTERM/SIGINT, before SIGKILL (default %(default)s)")
    parser.add_argument("--timeout", type=_positive_float, default=None,
                        help="wall-clock limit of the whole job in seconds (exit 124); default none")
    parser.add_argument("--port", type=int, default=None, help="coordinator port on 127.0.0.1 (default: a free one)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command every rank runs")
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("give the command after --, e.g. python -m es.launch --processes 2 -- python train.py")
    if args.cpus_per_process is not None and args.cpus_per_process * args.processes > len(os.sched_getaffinity(0)):
        print(
            f"es.launch: warning: {args.processes} x {args.cpus_per_process} cores requested but only "
            f"{len(os.sched_getaffinity(0))} are available; blocks wrap around and share cores.",
            file=sys.stderr,
        )
    return args


def main(argv: list[str] | None = None) -> int:
    return launch(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
