"""Restart schedules: IPOP (Auger & Hansen 2005) and BIPOP (Hansen 2009, "Benchmarking a BI-population CMA-ES
on the BBOB-2009 function testbed"), as pycma's ``cma.fmin2(..., restarts=9, bipop=True)`` runs them.

A schedule says, before each run, its population size, initial step size and evaluation budget, from the
evaluations earlier runs used:

- **IPOP**: run ``k`` (``k = 0, 1, ...``) has ``popsize = lambda_0 * 2**k`` and ``sigma0``.
- **BIPOP**: the first run has ``lambda_0``. Then, while the evaluations spent in the small-population
  regime (the first run counts there) are fewer than those spent in the large one, a *small* run follows:
  ``popsize = lambda_0 * 2**(n_large * U**2)``, ``sigma = sigma0 * 0.01**U'`` (``U``, ``U'`` uniform on
  [0, 1), ``n_large`` the large runs so far) and at most ``0.5 * (large evaluations) / popsize``
  generations; otherwise a *large* run, ``popsize = lambda_0 * 2**n_large`` after ``n_large += 1``, with
  ``sigma0``. The exponent of a small run's popsize is rounded to a whole octave, so that a small run's
  popsize is always one a large run (or the first) uses too: each new popsize is a new compiled program,
  and this way a BIPOP call compiles no more programs than an IPOP call (pycma truncates the exact value).

Both end once ``max_restarts`` restarts of the large kind (IPOP: every restart) have run, as pycma counts them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

RESTARTS = (None, "ipop", "bipop")
MAX_RESTARTS = 9
"""Restarts of the large (IPOP: any) kind at most, as in pycma's ``restarts=9`` (COCO's usual setting)."""
SMALL_OCTAVES = 4
"""Octaves one padded program serves at most where ``popsize * dim <= small_work`` (``program_popsizes``): a
fresh process's short calls on a few params (the README example's 7 to 56 members) compile one program, where
a smaller run's generations cost 10-25% more (its members past its own are drawn too: docs/benchmarks.md)."""
PADDED_OCTAVES = 2
"""Octaves one padded program serves at most past those (larger runs, whose generations cost more per member)."""
PAD_WORK = 2**16
"""A padded program's ``popsize * dim**2`` at most: CMA-ES's sums cost ``O(popsize n^2)`` a generation, so
past this a run pays for its padding; its octave then has a program of its own."""


def program_popsizes(first: int, dim: int, small_work: int) -> dict[int, int]:
    """``{run popsize: program popsize}`` for a schedule's octaves ``first * 2**k`` (``k <= MAX_RESTARTS``) on
    ``dim`` params: each octave's run is served by a padded program (``es.strategies.cma_es.padding``) of its
    group's largest popsize. Groups: of up to ``SMALL_OCTAVES`` octaves those with ``popsize * dim <=
    small_work`` (compiled without backend optimisation, ``es.engine.loop.SMALL_WORK``), then of up to
    ``PADDED_OCTAVES`` the others while ``popsize * dim**2 <= PAD_WORK``; past that one octave each. E.g.
    ``first = 7``, ``dim = 3``: one program of 56 for 7 to 56, one of 224 for 112 and 224, and so on; a call's
    10 octaves never need more than 10 programs."""
    served: dict[int, int] = {}
    group: list[int] = []

    def close():
        served.update({size: group[-1] for size in group})
        group.clear()

    for k in range(MAX_RESTARTS + 1):
        size = first * 2**k
        small = size * dim <= small_work
        if group and (len(group) == (SMALL_OCTAVES if small else PADDED_OCTAVES)
                      or small != (group[-1] * dim <= small_work)):
            close()
        if not small and size * dim * dim > PAD_WORK:
            close()
            served[size] = size
            continue
        group.append(size)
    close()
    return served


class RunSettings(NamedTuple):
    """One run of a restart schedule.

    Attributes:
      regime: ``"first"``, ``"large"`` (IPOP's runs too) or ``"small"``.
      popsize: members per generation.
      sigma: the initial step size.
      max_generations: generations at most (``None``: as many as the budget allows).
    """

    regime: str
    popsize: int
    sigma: float
    max_generations: int | None = None


class Schedule:
    """The runs of one ``es.minimize`` call: ``next(evaluations_of_previous_run)`` gives the next run's settings,
    or ``None`` when the schedule has no run left.

    Args:
      restarts: ``None`` (one run), ``"ipop"`` or ``"bipop"``.
      popsize: ``lambda_0``, the first run's population size.
      sigma: ``sigma0``.
      seed: seeds BIPOP's draws.
      max_restarts: restarts of the large kind at most.
    """

    def __init__(self, restarts: str | None, popsize: int, sigma: float, seed: int, max_restarts: int = MAX_RESTARTS):
        self.restarts, self.popsize, self.sigma, self.max_restarts = restarts, popsize, sigma, max_restarts
        self.random = np.random.default_rng(seed)
        self.large_runs = 0
        self.small_evaluations, self.large_evaluations = 0, 0
        self.last: RunSettings | None = None

    def next_large_popsize(self) -> int:
        """The popsize of the next large run (IPOP: the next run), whatever comes first."""
        return self.popsize * 2 ** (self.large_runs + 1)

    def next(self, evaluations: int = 0) -> RunSettings | None:
        """The next run, given the evaluations the previous one used (ignored before the first run)."""
        if self.last is not None:
            if self.last.regime == "large":
                self.large_evaluations += evaluations
            else:
                self.small_evaluations += evaluations
        if self.last is None:
            self.last = RunSettings("first", self.popsize, self.sigma)
        elif self.restarts is None or self.large_runs >= self.max_restarts:  # pycma ends after the last large run
            return None
        elif self.restarts == "ipop" or self.small_evaluations >= max(1, self.large_evaluations):
            self.large_runs += 1
            self.last = RunSettings("large", self.popsize * 2**self.large_runs, self.sigma)
        else:
            exponent = round(self.large_runs * self.random.uniform() ** 2)
            popsize = int(self.popsize * 2**exponent)
            sigma = self.sigma * 0.01 ** self.random.uniform()
            generations = max(1, int(0.5 * self.large_evaluations / popsize))
            self.last = RunSettings("small", popsize, sigma, generations)
        return self.last
