"""MuJoCo's warnings while a gymnasium environment is made: Python warnings, not lines on the terminal and a file.

MuJoCo prints a warning to stdout and appends it to ``MUJOCO_LOG.TXT`` in the working directory. With mujoco 4,
gymnasium's own ``half_cheetah.xml`` draws one at every load ("compiler attribute 'settotalmass' is
deprecated"): a line from each worker process of a HalfCheetah run, and a file in the user's directory, about a
model file the user cannot change. ``as_python_warnings()`` routes MuJoCo's warnings to Python's ``warnings``
(``RuntimeWarning``, shown once per process, filterable) for the duration of a block, dropping those about
gymnasium's bundled models (``BUNDLED_MODEL_WARNINGS``), and restores MuJoCo's handler after it.
"""

from __future__ import annotations

import contextlib
import warnings

BUNDLED_MODEL_WARNINGS = ("compiler attribute 'settotalmass' is deprecated",)
"""Starts of MuJoCo warnings about gymnasium's own model files, dropped: nothing a user can act on."""


@contextlib.contextmanager
def as_python_warnings():
    """MuJoCo's warnings inside the block as ``RuntimeWarning``s (those of ``BUNDLED_MODEL_WARNINGS`` dropped);
    the handler before it is put back after. Does nothing where mujoco is not installed."""
    try:
        import mujoco
    except ImportError:
        yield
        return
    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(_forward)
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)


def _forward(message: str) -> None:
    if not message.startswith(BUNDLED_MODEL_WARNINGS):
        warnings.warn(f"MuJoCo: {message}", RuntimeWarning, stacklevel=2)
