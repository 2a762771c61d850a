"""What several test files share: processes (is one alive, wait until some are gone)."""

from __future__ import annotations

import time


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def wait_until_dead(pids, timeout: float = 10.0) -> list:
    """The processes of ``pids`` still alive after waiting up to ``timeout`` seconds for all to end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if pid_alive(p)]
