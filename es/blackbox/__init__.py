"""Black-box optimisation: ``es.minimize`` (the front door), its restart schedules, the kinds of objective
it takes, and its options' layers (``bounds``, ``constraints``, ``integers``, ``uncertainty``, composed in
``layers``). docs/guides/black-box.md is the guide."""

from es.blackbox.bounds import Box
from es.blackbox.minimize import MinimizeResult, Run, minimize
from es.blackbox.restarts import RESTARTS, RunSettings, Schedule

__all__ = ["Box", "MinimizeResult", "RESTARTS", "Run", "RunSettings", "Schedule", "minimize"]
