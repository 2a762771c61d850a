"""Stopping a run on SIGTERM/SIGINT after the segment (or host generation) in progress, on every process at the
same boundary; a second signal stops at once."""

from __future__ import annotations

import os
import signal
import threading

from es.parallel import distributed


class Stopper:
    """Turns the first SIGTERM/SIGINT into a request to stop after the ``unit`` in progress (``"segment"``, or
    ``"generation"`` for a fitness on the host); the second raises ``KeyboardInterrupt`` (SIGINT) or
    ``SystemExit(128 + signum)`` at once, wherever the main thread waits.

    In a multi-process run the processes agree at every segment boundary
    (``agreed``): a signal to any one of them stops them all at the same boundary.
    Installing the handlers announces ``distributed.STOPPABLE`` (a supervisor such
    as ``es.launch`` then lets the process finish its segment).
    """

    def __init__(self, enabled: bool, verbose: bool, run_name: str, unit: str = "segment"):
        self.signum: int | None = None
        self._verbose = verbose
        self._name = run_name
        self._unit = unit
        self._previous = {}
        if enabled and threading.current_thread() is threading.main_thread():
            for signum in distributed.STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
            distributed.announce(distributed.STOPPABLE)

    def _handle(self, signum, frame):
        if self.signum is not None:  # the second signal: stop now, the last checkpoint stays valid
            self.restore()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        self.signum = signum
        if self._verbose:  # a raw write: no lock a progress bar or print may hold at this moment
            self._say(f"received {signal.Signals(signum).name}")

    def _say(self, what: str) -> None:
        os.write(2, (f"\n{what}: finishing the {self._unit} in progress, then checkpointing and stopping "
                     "(send it again to stop at once)\n").encode())

    def agreed(self, generation: int) -> int | None:
        """The signal that stops the run after the segment from ``generation``, or None; the same on every process."""
        if distributed.process_count() == 1:
            return self.signum
        requests = distributed.all_processes(f"{self._name}/stop/{generation}", str(self.signum or 0))
        signals = [int(request) for request in requests]
        stopping = [(p, s) for p, s in enumerate(signals) if s]
        if not stopping:
            return None
        process, signum = stopping[0]
        if self.signum is None and self._verbose:
            self._say(f"process {process} received {signal.Signals(signum).name}")
        return signum

    def restore(self):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
