"""The strategies: each one file, its maths in its docstring (``es/strategies/base.py`` is the contract).

``shaping`` (fitness shaping and rank weights), ``optimizers`` (``es.clipup``, optimizers by name, the
coordinatewise declaration) and ``recombination`` (the CMA-ES family's weights) are what they share.
"""

from es.strategies import optimizers, shaping
from es.strategies.ars import ARS, ARSState
from es.strategies.cma_es import CMAES, CMAESState
from es.strategies.open_es import OpenES, OpenESState
from es.strategies.pgpe import PGPE, PGPEState
from es.strategies.sep_cma_es import SepCMAES, SepCMAESState
from es.strategies.snes import SNES, SNESState

STRATEGIES = {cls.__name__: cls for cls in (OpenES, SNES, PGPE, ARS, SepCMAES, CMAES)}
"""Every strategy class by name (the ``name`` of a config's ``strategy`` section)."""

__all__ = [
    "ARS", "ARSState", "CMAES", "CMAESState", "OpenES", "OpenESState", "PGPE", "PGPEState", "STRATEGIES", "SNES",
    "SNESState", "SepCMAES", "SepCMAESState", "optimizers", "shaping",
]
