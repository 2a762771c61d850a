"""Keeping orbax's and asyncio's noise off a user's stderr, where es already reports what happened: the
tracebacks and log records that a failed checkpoint read or write leaves behind (``es.runs.checkpoint``
installs these)."""

from __future__ import annotations

import logging
import sys


def drop_closed_event_loop_noise() -> None:
    """Keep orbax's "Event loop is closed" tracebacks, and its unawaited failed reads
    (``drop_unretrieved_read_errors``), off stderr (installed once, for the whole process).

    When tensorstore fails to read a corrupt checkpoint, orbax leaves callbacks behind that later try to
    reach an asyncio event loop it has closed; Python prints each as a traceback although nothing failed
    that was not already reported (the checkpoint is skipped with one warning). This ``sys.unraisablehook``
    drops exactly those (a ``RuntimeError('Event loop is closed')`` raised in asyncio) and passes everything
    else on to the hook that was there before.
    """
    previous = sys.unraisablehook
    if getattr(previous, "drops_closed_event_loop_noise", False):
        return

    def hook(unraisable):
        error, trace = unraisable.exc_value, unraisable.exc_traceback
        while trace is not None and trace.tb_next is not None:
            trace = trace.tb_next
        if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed" and trace is not None
                and "asyncio" in trace.tb_frame.f_code.co_filename):
            previous(unraisable)

    hook.drops_closed_event_loop_noise = True
    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(drop_unretrieved_read_errors)


def drop_unretrieved_read_errors(record) -> bool:
    """A logging filter for asyncio's logger: drops "Task exception was never retrieved" (or "Future ...") where
    the exception is tensorstore's failure to open a checkpoint's arrays (``Error opening "..." driver``).
    Reading a corrupt checkpoint, orbax starts a read per leaf and stops at the first failure, which es reports
    as one warning (or a clear error); the other reads fail the same way, and asyncio logged each with a
    traceback whenever the garbage collector came to its task. Writing to a full disk, the arrays' writes fail
    so too after the first failure, which es reports as a ``RunDirError``. Every other record passes."""
    error = record.exc_info[1] if record.exc_info else None
    return not (str(record.msg).startswith(("Task exception was never retrieved", "Future exception was never "
                                            "retrieved")) and isinstance(error, ValueError)
                and 'Error opening "' in str(error))


def drop_orbax_errors(record) -> bool:
    """A logging filter: orbax's ERROR records of a failed write (``Checkpointer`` raises it as a ``RunDirError``)."""
    return not (record.levelno >= logging.ERROR and "orbax" in record.pathname)


class without_orbax_notices:
    """Drops orbax's notices of what a reader expects: "Given directory is read only" (reading without
    writing is what we ask for) and "Metadata file does not exist" (an old checkpoint that a kill left half
    deleted, which the writer removes once the run is accepted)."""

    def __enter__(self):
        self._logger = logging.getLogger("absl")
        self._logger.addFilter(self._filter)

    @staticmethod
    def _filter(record) -> bool:
        return not str(record.msg).startswith(("Given directory is read only", "Metadata file does not exist"))

    def __exit__(self, *exc):
        self._logger.removeFilter(self._filter)
