"""``python -m experiments.train ARGS`` with every filesystem write under the run directory audited.

    python tests/workers/train_audited.py ARGS...     # the arguments of experiments.train

The run directory is the value of ``--run-dir`` or ``--resume``. A process
other than process 0 that opens a file there for writing, or creates, renames
or removes anything there, fails on the spot (``PermissionError``, and an
``audit: process R wrote ...`` line on stderr). Python's audit hooks see the
file operations of Python code (``open``, ``os.*``, ``shutil``, ``pathlib``,
numpy, orbax's own path handling), not writes made from C++ (tensorstore's
array files, which orbax starts only where ``Checkpointer.save`` runs).

At exit each process reports how many writes it made there
(``audit: process R made N writes``), so a test can check that the audit saw
process 0's. With ``ES_TEST_PID_DIR`` set, each process first writes its pid
to ``ES_TEST_PID_DIR/rank<R>.pid``.
"""

import atexit
import os
import runpy
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
args = sys.argv[1:]
RUN_DIR = next(os.path.realpath(args[i + 1]) for i, a in enumerate(args[:-1]) if a in ("--run-dir", "--resume"))
RANK = int(os.environ.get("ES_PROCESS_ID", "0"))
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
PATH_EVENTS = {  # event -> positions of its path arguments
    "os.mkdir": (0,), "os.rename": (0, 1), "os.remove": (0,), "os.rmdir": (0,), "shutil.rmtree": (0,),
    "os.truncate": (0,), "os.chmod": (0,), "os.link": (0, 1), "os.symlink": (0, 1), "os.utime": (0,),
}
writes = []


def _in_run_dir(path) -> bool:
    if isinstance(path, int) or path is None:
        return False
    path = os.path.realpath(os.fsdecode(path))
    return path == RUN_DIR or path.startswith(RUN_DIR + os.sep)


def _writes(event: str, args: tuple) -> list:
    if event == "open":
        path, mode, flags = args
        writing = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & WRITE_FLAGS)
        return [path] if writing and _in_run_dir(path) else []
    return [args[i] for i in PATH_EVENTS.get(event, ()) if i < len(args) and _in_run_dir(args[i])]


def audit(event: str, args: tuple) -> None:
    if event != "open" and event not in PATH_EVENTS:
        return
    paths = _writes(event, args)
    if not paths:
        return
    writes.append((event, paths))
    if RANK != 0:
        os.write(2, f"audit: process {RANK} wrote {event} {paths}\n".encode())
        raise PermissionError(f"process {RANK} must not write under the run directory: {event} {paths}")


@atexit.register
def report() -> None:
    os.write(2, f"audit: process {RANK} made {len(writes)} writes\n".encode())


if os.environ.get("ES_TEST_PID_DIR"):
    with open(os.path.join(os.environ["ES_TEST_PID_DIR"], f"rank{RANK}.pid"), "w") as f:
        f.write(str(os.getpid()))
sys.addaudithook(audit)
sys.argv = ["experiments.train", *args]
runpy.run_module("experiments.train", run_name="__main__", alter_sys=True)
