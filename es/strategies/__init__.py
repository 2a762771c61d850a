"""The strategies: each one file, its maths in its docstring (see ``es/strategies/base.py`` for the interface)."""

from es.strategies.ars import ARS, ARSState
from es.strategies.open_es import OpenES, OpenESState
from es.strategies.pgpe import PGPE, PGPEState
from es.strategies.sep_cma_es import SepCMAES, SepCMAESState
from es.strategies.snes import SNES, SNESState

STRATEGIES = {cls.__name__: cls for cls in (OpenES, SNES, PGPE, ARS, SepCMAES)}
"""Every strategy class by name (the ``name`` of a config's ``strategy`` section)."""

__all__ = [
    "ARS", "ARSState", "OpenES", "OpenESState", "PGPE", "PGPEState", "STRATEGIES", "SNES", "SNESState",
    "SepCMAES", "SepCMAESState",
]
