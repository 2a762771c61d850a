"""COCO's suites beyond bbob for ``experiments/bench/coco.py --suite``: how each suite's bounds, constraints,
integer variables and noise reach each solver, and what "solved" reads there.

=================  ===========================================  ===========================================
suite              es.minimize                                  pycma (BIPOP, ``restarts=9, bipop=True``)
=================  ===========================================  ===========================================
bbob               (nothing)                                    ``cma.fmin2``, ``ftarget``
bbob-boxed         ``bounds=(lower, upper)``                    ``fmin2``, options ``bounds`` (BoundTransform)
bbob-constrained   ``constraints=problem.constraint``           ``cma.fmin_con2(..., constraints=...)``
bbob-mixint        ``bounds``, ``integer_variables`` (the        ``fmin2``, options ``bounds`` and
                   first ``number_of_integer_variables``)       ``integer_variables``
bbob-noisy         ``noisy=True``                               ``fmin2(..., noise_handler=True)``
=================  ===========================================  ===========================================

Both get the problem's ``initial_solution`` as ``x0`` (the middle of the box; bbob-constrained's is a
feasible point, bbob-mixint's has integral values), ``sigma0 = 2`` and the same seed, and stop at the
budget or the final target: es's ``target = f_opt + 1e-8`` (on a feasible point with constraints, on one
evaluation with noise), pycma's ``ftarget`` the same, except with constraints, where pycma's values are
augmented-Lagrangian values: there it stops on cocoex's ``problem.final_target_hit`` (its
``termination_callback``, which also ends its restarts).

**Solved.** The best ``f - f_opt`` a solver reached counts COCO's 51 targets as for bbob. For bbob,
bbob-boxed and bbob-mixint it is ``problem.best_observed_fvalue1 - f_opt``. For bbob-noisy the measured
values are noisy: COCO judges the *noise-free* value of each evaluated point, and for bbob-constrained
``f - f_opt + sum_i max(0, g_i)`` of each (a feasible point counts its ``f``, an infeasible one its
violations too), which is what cocopp reads; both are the third column of COCO's ``.dat`` file, logged at
every improvement on a grid of 20 values a decade that holds the 51 targets, read here per problem
(``logged_delta``). COCO's budget with constraints counts f- and g-evaluations; both solvers evaluate
``g`` once with every ``f``, so the f-budget is both.
"""

from __future__ import annotations

import os
import warnings


SUITES = ("bbob", "bbob-boxed", "bbob-constrained", "bbob-mixint", "bbob-noisy")
DIMS = {"bbob": (2, 3, 5, 10, 20), "bbob-mixint": (5, 10, 20)}
"""Default dimensions per suite (others: 2, 5, 10, 20)."""
FUNCTIONS = {"bbob-constrained": "1-54", "bbob-noisy": "1-30"}
"""Default function indices per suite (cocoex's positions: bbob-noisy's 1-30 are f101-f130; others: 1-24)."""
LOGGED = ("bbob-constrained", "bbob-noisy")
"""Suites whose solved fraction reads COCO's logged indicator, not ``best_observed_fvalue1``."""


def dims(suite: str) -> tuple[int, ...]:
    return DIMS.get(suite, (2, 5, 10, 20))


def functions(suite: str) -> str:
    return FUNCTIONS.get(suite, "1-24")


def es_options(suite: str, problem) -> dict:
    """The keyword arguments of ``es.minimize`` for this suite's ``problem``."""
    if suite == "bbob-boxed":
        return {"bounds": (problem.lower_bounds, problem.upper_bounds)}
    if suite == "bbob-constrained":
        return {"constraints": problem.constraint}
    if suite == "bbob-mixint":
        return {"bounds": (problem.lower_bounds, problem.upper_bounds),
                "integer_variables": list(range(problem.number_of_integer_variables))}
    if suite == "bbob-noisy":
        return {"noisy": True}
    return {}


def run_pycma(suite: str, problem, x0, settings: dict):
    """pycma's BIPOP on ``problem`` with the suite's option; ``settings``: ``max_evals``, ``target``, ``sigma0``,
    ``seed``, ``restarts``. Returns pycma's ``CMAEvolutionStrategy`` of the last run."""
    import cma

    options = {"maxfevals": settings["max_evals"], "ftarget": settings["target"], "seed": settings["seed"],
               "verbose": -9}
    kwargs = {"restarts": settings["restarts"], "bipop": True}
    if suite in ("bbob-boxed", "bbob-mixint"):
        options["bounds"] = [list(problem.lower_bounds), list(problem.upper_bounds)]
    if suite == "bbob-mixint":
        options["integer_variables"] = list(range(problem.number_of_integer_variables))
    if suite == "bbob-noisy":
        kwargs["noise_handler"] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pycma's notes on flat fitness, sigma changes, ...; verbose=-9 keeps the rest
        if suite == "bbob-constrained":
            del options["ftarget"]  # augmented-Lagrangian values: stop on COCO's own verdict instead
            options["termination_callback"] = lambda _: problem.final_target_hit
            _, strategy = cma.fmin_con2(problem, x0, settings["sigma0"], constraints=problem.constraint,
                                        options=options, **kwargs)
        else:
            _, strategy = cma.fmin2(problem, x0, settings["sigma0"], options, **kwargs)
    return strategy


def logged_delta(dat_path: str) -> float:
    """The best value of COCO's logged indicator (the ``.dat``'s third column) for the problem whose block is
    the file's last: the noise-free ``f - f_opt``, plus the sum of positive constraint values where there are
    constraints."""
    block: list[float] = []
    with open(dat_path) as f:
        for line in f:
            if line.startswith("%"):
                block = []
            elif line.strip():
                block.append(float(line.split()[2]))
    return min(block) if block else float("inf")


def best_delta(suite: str, problem, f_opt: float, dat_path: str) -> float:
    """What the solver reached on ``problem``: the ``f - f_opt`` whose targets count (module docstring)."""
    if suite in LOGGED and os.path.exists(dat_path):
        return logged_delta(dat_path)
    return float(problem.best_observed_fvalue1 - f_opt)


def agrees(suite: str, final_target_hit: bool, delta: float, final_target: float) -> bool:
    """Whether cocoex's ``final_target_hit`` agrees with ``delta <= final_target`` (checked after every run).
    With constraints cocoex's flag reads the best *feasible* f, which the logged indicator may undercut by a
    point violating less than the target: there a hit by the flag must be a hit by the indicator. With noise
    it reads the measured values, which stay above the target where the noise-free value is at it: no check."""
    if suite == "bbob-noisy":
        return True
    if suite == "bbob-constrained":
        return delta <= final_target or not final_target_hit
    return final_target_hit == (delta <= final_target)


def final_hit(suite: str, final_target_hit: bool, delta: float, final_target: float) -> bool:
    """Whether the final target counts as hit: cocoex's flag, or for the suites whose ``delta`` is COCO's
    logged indicator, ``delta <= final_target`` (cocoex's flag reads measured, or feasible-only, values)."""
    return bool(delta <= final_target) if suite in LOGGED else final_target_hit
