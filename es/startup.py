"""What importing es does to the interpreter: its imports run without the cyclic garbage collector.

Importing es imports JAX, optax and es itself: about 120,000 objects (modules, functions, classes, constants)
that live as long as the process. Python's cyclic collector would traverse them over and over while they are
made (about 0.08 s of a 0.6 s import on a 2-core CPU) and once more at exit, for nothing (0.15-0.2 s after a
short ``es.minimize`` run). ``long_lived_imports`` switches the collector off around the imports and then
freezes every object it tracks (``gc.freeze``: moved to the permanent generation, which collections skip;
reference counting still frees them). That is what a script of a few seconds, the README example, notices:
its fresh process 0.2-0.3 s quicker (docs/benchmarks.md, "Time to a first result"). The cost: cyclic garbage
made before or during the import (a few hundred objects of JAX's import) is never collected.
"""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def long_lived_imports():
    """Inside: no cyclic collection. After: every tracked object frozen, the collector as it was before."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if collecting:
            gc.enable()
