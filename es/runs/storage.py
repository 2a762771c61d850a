"""Writing into a run directory: whole files or nothing, and one clear error when the disk says no.

Every write of ``es.run`` and of the training CLI goes through here or turns
its failure into a ``RunDirError``: no space left, a read-only file system, a
permission, a file in the way. The error names the path and the cause in one
paragraph; what was being written is removed again (a temporary file, an
appended piece of a line), so the run directory keeps its last consistent
state and resumes once the cause is fixed.
"""

from __future__ import annotations

import contextlib
import errno as errno_codes
import os
import pathlib
from typing import BinaryIO, Callable

# The causes a write can fail with, by errno, as orbax and tensorstore report them in their messages.
_KNOWN_CAUSES = (errno_codes.ENOSPC, errno_codes.EDQUOT, errno_codes.EROFS, errno_codes.EACCES, errno_codes.EPERM,
                 errno_codes.EFBIG, errno_codes.EIO, errno_codes.ENOTDIR, errno_codes.EISDIR, errno_codes.ENOENT)


class RunDirError(OSError):
    """A file of the run directory cannot be written (no space left, read-only, no permission, ...).

    ``filename`` is the path, ``strerror`` the cause, ``errno`` its code when known. The message says what
    the run directory now holds and how to go on.
    """

    def __init__(self, path, cause: str, code: int | None = None, after: str = ""):
        super().__init__(code, cause, str(path))
        self.after = after

    def with_context(self, after: str) -> "RunDirError":
        """The same error with what the run directory now holds and how to go on."""
        return RunDirError(self.filename, self.strerror, self.errno, after)

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}." + (f" {self.after}" if self.after else "")


def write_error(path, error: BaseException) -> RunDirError:
    """``error`` (an ``OSError``, or orbax's and tensorstore's reports of one) as a ``RunDirError`` about ``path``."""
    if isinstance(error, RunDirError):
        return error
    seen = error
    while seen is not None:  # an OSError anywhere in the chain names the cause exactly
        if isinstance(seen, OSError) and seen.errno:
            return RunDirError(path, seen.strerror or os.strerror(seen.errno), seen.errno)
        seen = seen.__cause__ or seen.__context__
    text = str(error)
    for code in _KNOWN_CAUSES:
        if os.strerror(code) in text:
            return RunDirError(path, os.strerror(code), code)
    first_line = text.splitlines()[0] if text else type(error).__name__
    return RunDirError(path, first_line[:200])


@contextlib.contextmanager
def writing(path):
    """Turn an ``OSError`` raised inside into a ``RunDirError`` about ``path``."""
    try:
        yield
    except OSError as error:
        raise write_error(path, error) from error


def write_atomically(path, data: bytes | str | Callable[[BinaryIO], None]) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, synced, then renamed over it.

    ``data`` is the content, or a function that writes it to the open (binary) file.

    On failure the temporary file is removed and ``path`` is as it was; raises ``RunDirError``.
    """
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with writing(path):
            with open(tmp, "wb") as f:
                if callable(data):
                    data(f)
                else:
                    f.write(data.encode() if isinstance(data, str) else data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def append_whole(path, text: str) -> int:
    """Append ``text`` to ``path`` whole or not at all; the file's new size. Raises ``RunDirError``.

    A failed append (a full disk mid-line) is cut off again, so the file ends where it ended before.
    """
    path = pathlib.Path(path)
    data = text.encode()
    with writing(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                written = 0
                while written < len(data):  # unbuffered: nothing is left to flush later
                    written += os.write(fd, data[written:])
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise
            return size + len(data)
        finally:
            os.close(fd)
