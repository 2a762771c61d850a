"""Black-box optimisation: ``es.minimize`` (the front door), its restart schedules and the kinds of objective
it takes. docs/guides/black-box.md is the guide."""

from es.blackbox.minimize import MinimizeResult, Run, minimize
from es.blackbox.restarts import RESTARTS, RunSettings, Schedule

__all__ = ["MinimizeResult", "RESTARTS", "Run", "RunSettings", "Schedule", "minimize"]
