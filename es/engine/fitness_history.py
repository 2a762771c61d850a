"""The stopping conditions that read the fitness history, kept on the host: es.minimize's ask/tell loop.

A ``Loop`` (``es.engine.loop``) hands every generation's fitnesses to its program from the host, so it
can keep the history there too. Its program then records no ``State.stop_history`` and computes only the
conditions that read the state (``stopping.OnTheState``); ``HostHistory`` records each generation and
finds ``tolfun``, ``tolfunhist`` and ``stagnation`` in numpy, with the arithmetic of ``es.engine.stopping``
(``record``, ``history_conditions``, ``_stagnated``) in the fitness dtype, so a run stops at the same
generation. Without them the step program compiles in about a sixth less time (CMAES, D = 3, popsize 7:
2,582 HLO instructions against 3,187, 1.04 against 1.25 s); recording and checking a generation here takes
about 13 us, what the smaller program saves per call.
"""

from __future__ import annotations

import numpy as np

from es.engine.stopping import CRITERIA, MAX_SPARSE, SPARSE_EVERY, StopCriteria

HISTORY_CRITERIA = ("tolfun", "tolfunhist", "stagnation")
"""The conditions ``HostHistory`` finds (the others read the state, and its program finds them)."""


def _push(buffer: np.ndarray, new) -> None:
    """``stopping._pushed`` in place: ``new`` in front, the oldest entry dropped."""
    buffer[1:] = buffer[:-1]
    buffer[0] = new


def _extremes(values: np.ndarray, where: np.ndarray):
    """``stopping.extremes``: ``(max, min)`` of ``values[where]`` (``-inf, inf`` where none is selected)."""
    return values.max(initial=-np.inf, where=where), values.min(initial=np.inf, where=where)


def _median(values: np.ndarray, valid: np.ndarray):
    """``stopping.valid_median``: the mean of the two middle valid values, NaN where none is."""
    count = int(np.sum(valid))
    ordered = np.sort(np.where(valid, values, np.inf))
    if count == 0:
        return values.dtype.type(np.nan)
    return (ordered[max(count - 1, 0) // 2] + ordered[count // 2]) / values.dtype.type(2)


class HostHistory:
    """``stopping.History`` and its conditions in numpy: ``record`` a generation, then ``conditions()``."""

    def __init__(self, dim: int, popsize: int, dtype, maximize: bool, criteria: StopCriteria):
        self.dim, self.popsize, self.maximize, self.criteria = dim, popsize, maximize, criteria
        self.recent = criteria.recent(dim, popsize)
        self.dtype = np.dtype(dtype)
        self.best, self.best_residual = (np.zeros((self.recent + 1,), self.dtype) for _ in range(2))
        self.sparse_best, self.sparse_median = (np.zeros((MAX_SPARSE,), self.dtype) for _ in range(2))
        self.count, self.since_record = 0, 0
        self.record_value, self.record_residual = self.dtype.type(-np.inf), self.dtype.type(0)
        self.spread = self.dtype.type(-np.inf)  # of the last generation's valid fitnesses, ranked
        self.residual_seen = False  # a best fitness recorded with a residual that is not zero

    def ranked(self, value: np.ndarray, residual: np.ndarray) -> np.ndarray:
        """``generation.rank``'s ranked values of host ``Fitnesses`` with a residual somewhere."""
        valid = np.isfinite(value)
        better = value if self.maximize else -value
        reference = value[np.argmax(np.where(valid, better, -np.inf))]
        return (value - (reference if np.isfinite(reference) else self.dtype.type(0))) + residual

    def record(self, value: np.ndarray, residual: np.ndarray) -> None:
        """Add a generation's fitnesses (``from_host``'s value and residual, float[popsize] of ``dtype``).

        ``stopping.record``, with shortcuts that give the same values: where every member is valid, the best
        is ``argmin``'s (``argmax``'s when maximising) and the spread needs no mask."""
        exact = not residual.any()
        ranked, valid = value if exact else self.ranked(value, residual), np.isfinite(value)
        every = bool(valid.all())
        if every:
            index = ranked.argmax() if self.maximize else ranked.argmin()
            self.spread = ranked.max() - ranked.min()
        else:
            index = np.argmax(np.where(valid, ranked if self.maximize else -ranked, -np.inf))
            largest, smallest = _extremes(ranked, valid)
            self.spread = largest - smallest
        sign = self.dtype.type(1 if self.maximize else -1)
        best, best_residual = sign * value[index], sign * residual[index]
        if every or valid.any():
            self.count += 1
            self.residual_seen |= bool(best_residual != 0)
            _push(self.best, best)
            _push(self.best_residual, best_residual)
            if self.count % SPARSE_EVERY == 0:
                _push(self.sparse_best, best)
                _push(self.sparse_median, sign * _median(value, valid))
            if (best - self.record_value) + (best_residual - self.record_residual) > 0:
                self.record_value, self.record_residual, self.since_record = best, best_residual, 0
            else:
                self.since_record += 1

    def conditions(self) -> dict[str, bool]:
        """``stopping.history_conditions`` after the last record: ``tolfun``, ``tolfunhist``, ``stagnation``."""
        criteria, count = self.criteria, self.count
        if count == 0:
            return dict.fromkeys(HISTORY_CRITERIA, False)
        best = self.best[:self.recent]
        relative = best - best[0]
        if self.residual_seen:  # otherwise every residual is a zero, and adding their differences changes nothing
            residual = self.best_residual[:self.recent]
            relative = relative + (residual - residual[0])
        if count >= self.recent:
            history_range = relative.max() - relative.min()
        else:
            largest, smallest = _extremes(relative, np.arange(self.recent) < count)
            history_range = largest - smallest
        return {"tolfun": bool(self.spread < criteria.tolfun and history_range < criteria.tolfun),
                "tolfunhist": bool(count > 9 and history_range < criteria.tolfunhist),
                "stagnation": self._stagnated()}

    def bitmask(self) -> int:
        """The conditions met, as bits of the ``"stop"`` metric (``stopping.CRITERIA``'s order)."""
        return sum(1 << CRITERIA.index(name) for name, met in self.conditions().items() if met)

    def _stagnated(self) -> bool:
        """``stopping._stagnated``: pycma's ``tolstagnation`` over the sparse history."""
        period = self.criteria.stagnation(self.dim, self.popsize)
        entries = min(self.count // SPARSE_EVERY, MAX_SPARSE)
        length = int(max(period / 10, entries / 10))
        ready = (self.count > self.dim * (5 + 100 / self.popsize) and self.since_record > period / 2
                 and entries > 100 and 2 * length < entries)
        if not ready:
            return False
        low, high = (length - 1) // 2, length // 2

        def medians(buffer):
            return [(ordered[low] + ordered[high]) / self.dtype.type(2)
                    for ordered in (np.sort(buffer[:length]), np.sort(buffer[length:2 * length]))]

        (newest_best, before_best), (newest_median, before_median) = medians(self.sparse_best), medians(
            self.sparse_median)
        return bool(newest_best <= before_best and newest_median <= before_median)
