"""COCO's bbob suite: ``es.minimize`` (BIPOP) against pycma's ``cma.fmin2`` (BIPOP) on the same problems.

    python -m experiments.bench.coco                                     # the full sweep (hours, see below)
    python -m experiments.bench.coco --dims 2,3 --instances 1-3 --functions 1-24 --solvers pycma
    python -m experiments.bench.coco --postprocess DIR_ES DIR_PYCMA      # cocopp's ECDFs of two COCO folders
    python -m experiments.bench.coco --report A-problems.jsonl B-problems.jsonl   # the table of split sweeps
    python -m experiments.bench.coco --suite bbob-boxed                  # bbob-constrained, bbob-mixint, bbob-noisy

``--suite`` runs another of COCO's suites, each solver with its option for it (bounds, constraints, integer
variables, noise); ``experiments/bench/coco_suites.py`` says what each gets and how "solved" reads there.
The rest of this docstring is the bbob sweep's, and holds for every suite.

What runs. Every bbob problem of ``--dims`` (default 2, 3, 5, 10, 20),
``--functions`` (1-24) and ``--instances`` (1-15: positions in cocoex's list
of bbob instances, its ``instance_indices``; with cocoex 2.8.2 the instances
1-5 and 71-80, COCO's current default) is solved by each solver of
``--solvers`` (``es``, ``pycma``), one after the other on the same problem
(solver order alternating from problem to problem), in this one process:

- ``es``: ``es.minimize(problem, x0, SIGMA0, max_evals=..., restarts="bipop",
  target=f_opt + 1e-8, seed=...)`` with es's default strategy;
- ``pycma``: ``cma.fmin2(problem, x0, SIGMA0, {"maxfevals": ..., "ftarget":
  f_opt + 1e-8, "seed": ..., "verbose": -9}, restarts=9, bipop=True)``.

Each solver gets its own ``cocoex.Suite`` and ``cocoex.Observer`` (so COCO
writes one data folder per solver, under ``--coco-dir``, for ``cocopp``).
Per problem: ``x0`` is the problem's initial solution (the origin, the middle
of the search box [-5, 5]^D) and ``SIGMA0 = 2``, COCO's own example experiment
(``example_experiment2.py``: ``cma.fmin2(problem, x0, 2, ...)``);
``--x0 proposal`` passes ``problem.initial_solution_proposal`` instead, a
callable that pycma calls at every restart (the origin first, then random
points, as pycma's docs recommend), to both solvers. The script first
evaluates ``x0`` once (COCO's example does the same, "making algorithms more
comparable"); the solver then gets the rest of the budget,
``--budget-multiplier`` x D evaluations in all (default 1e4 x D).

Stopping, the same for both: the budget, and the final target ``f - f_opt <=
1e-8`` (COCO's ``problem.final_target_hit``), passed as an absolute target
``f_opt + 1e-8`` (es.minimize's ``target``: stop when f <= target; pycma's
``ftarget``: the same comparison, and ``fmin2`` then makes no further
restarts). cocoex hides ``f_opt``, but its observer writes it into the header
of the ``.dat`` file it opens at a problem's first evaluation ("best
noise-free fitness - Fopt (7.948000000000e+01)"); ``f_opt_from_dat`` reads it
there. After every run the script checks that its own ``best f - f_opt <=
1e-8`` agrees with cocoex's ``problem.final_target_hit``.

Solved: COCO's standard targets ``f - f_opt <= 10^(2 - k/5)``, k = 0..50 (51
targets from 1e2 to 1e-8, those of cocopp's runtime ECDFs). A (function,
instance, target) triple is solved when the best ``f - f_opt`` the solver
reached within the budget (cocoex's ``problem.best_observed_fvalue1 - f_opt``)
is at or below the target; the table gives the fraction of all such triples
of the dimension that each solver solved, which is the height that cocopp's
runtime ECDF over all functions reaches at the budget (before its simulated
restarts). ``--postprocess`` recomputes these fractions from the COCO folders
with cocopp's own ``DataSet.detEvals`` as a cross-check and draws cocopp's
figures (``pprldmany_*``: the runtime ECDFs over all functions, per dimension).

Output. Per dimension, once its problems are done: dimension | es solved % |
pycma solved % | difference (es - pycma, percentage points) | es wall s |
pycma wall s | es cpu s | pycma cpu s | evaluations of each | es compile s (seconds JAX spent
tracing, lowering and compiling during es's runs) | problems whose final
target 1e-8 each solver hit. Wall seconds are summed over the solver calls
(the x0 evaluation, COCO's bookkeeping and es's compilations included).
CPU seconds (``time.process_time``, all threads of the process) are summed
likewise: on a shared machine they move less than wall seconds. ``--out``
(default ``experiments/bench/results/coco.json``) gets the rows and the
machine, its ``.md`` the table; ``<coco-dir>/<tag>-problems.jsonl`` one line
per (solver, problem), from which ``--report`` rebuilds the table (of
several sweeps together: a sweep split over processes by dimension).

The budget: the full sweep is 5 dimensions x 24 functions x 15 instances =
1,800 problems per solver, up to 1e4 x D evaluations each; pycma alone takes
hours, most of them in D=20 (docs/guides/black-box.md has the wall times
measured). ``--cocopp`` then draws cocopp's figures into
``<coco-dir>/ppdata``.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import time
import warnings

import numpy as np

from experiments.bench import coco_suites
from experiments.bench.common import (CompileClock, machine_description, markdown_table, use_compilation_cache,
                                      write_results)

SOLVERS = ("es", "pycma")
DIMS = (2, 3, 5, 10, 20)
FUNCTIONS = tuple(range(1, 25))
INSTANCES = tuple(range(1, 16))
SIGMA0 = 2.0
BUDGET_MULTIPLIER = 1e4
TARGETS = tuple(float(t) for t in 10 ** np.arange(2, -8.2, -0.2))  # 1e2 ... 1e-8, as cocopp computes them
FINAL_TARGET = 1e-8
PYCMA_RESTARTS = 9
RESULTS = os.path.join(os.path.dirname(__file__), "results")
ES_UNAVAILABLE = "es.minimize is not available in this checkout"


def parse_indices(text: str) -> list[int]:
    """``"1-3,5"`` -> ``[1, 2, 3, 5]`` (the syntax of cocoex's suite options)."""
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        values.extend(range(int(low), int(high or low) + 1))
    return sorted(set(values))


def hits(delta: float) -> int:
    """How many of COCO's 51 standard targets ``f - f_opt = delta`` reaches (``delta <= target``)."""
    return sum(delta <= t for t in TARGETS)


def problem_seed(base: int, dim: int, function: int, instance: int) -> int:
    """A seed per problem (> 0: pycma draws a random seed for 0), the same for both solvers."""
    return base * 1_000_000 + dim * 10_000 + function * 100 + instance


# --------------------------------------------------------------------------- COCO's data


def dat_path(result_folder: str, function: int, dim: int) -> str:
    return os.path.join(result_folder, f"data_f{function}", f"bbobexp_f{function}_DIM{dim}.dat")


_FOPT = re.compile(r"Fopt \(([-+0-9.eE]+)\)")


def f_opt_from_dat(result_folder: str, function: int, dim: int) -> float:
    """``f_opt`` of the problem the observer of ``result_folder`` opened last for this function and dimension.

    cocoex's bbob observer writes a header per problem into ``data_f<f>/bbobexp_f<f>_DIM<d>.dat`` at the
    problem's first evaluation; the header's "best noise-free fitness - Fopt (<f_opt>)" is the value that
    the logged ``f - f_opt`` and ``problem.final_target_hit`` are computed against.
    """
    path = dat_path(result_folder, function, dim)
    with open(path) as f:
        headers = [line for line in f if line.startswith("%") and "Fopt (" in line]
    if not headers:
        raise RuntimeError(f"no 'Fopt (...)' header in {path}: evaluate the observed problem once before")
    return float(_FOPT.search(headers[-1]).group(1))


# --------------------------------------------------------------------------- the two solvers


def es_available() -> bool:
    import es

    return hasattr(es, "minimize")


def run_es(problem, x0, max_evals: int, target: float, seed: int, suite: str = "bbob") -> dict:
    import es

    result = es.minimize(problem, x0, SIGMA0, max_evals=max_evals, restarts="bipop", target=target, seed=seed,
                         **coco_suites.es_options(suite, problem))
    return {"restarts": _jsonable(getattr(result, "restarts", None)), "stop": _jsonable(getattr(result, "stop", None)),
            "nfev": _jsonable(getattr(result, "nfev", None))}


def run_pycma(problem, x0, max_evals: int, target: float, seed: int, suite: str = "bbob") -> dict:
    import cma

    options = {"maxfevals": max_evals, "ftarget": target, "seed": seed, "verbose": -9}
    if suite != "bbob":
        strategy = coco_suites.run_pycma(suite, problem, x0, {"max_evals": max_evals, "target": target, "seed": seed,
                                                              "sigma0": SIGMA0, "restarts": PYCMA_RESTARTS})
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pycma's notes on flat fitness, sigma changes, ...; verbose=-9: the rest
            _, strategy = cma.fmin2(problem, x0, SIGMA0, options, restarts=PYCMA_RESTARTS, bipop=True)
    runs = [stop for stop in strategy.all_stoppings if stop is not None]  # one dict per run (a None first)
    return {"restarts": len(runs) - 1, "stop": sorted(strategy.stop()),
            "nfev": int(strategy.countevals)}


RUNNERS = {"es": run_es, "pycma": run_pycma}


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def solve(solver: str, problem, result_folder: str, budget: int, seed: int, x0_mode: str,
          clock: CompileClock | None = None, suite: str = "bbob") -> dict:
    """Run ``solver`` on the observed ``problem``; its record (best f - f_opt, targets hit, evaluations, seconds)."""
    dim, function, instance = problem.dimension, problem.id_function, problem.id_instance
    start, cpu_start = time.perf_counter(), time.process_time()
    compile_before = (clock.seconds, clock.compiles) if clock else (0.0, 0)
    problem(problem.initial_solution)  # opens COCO's .dat (its header holds f_opt); COCO's example does the same
    f_opt = f_opt_from_dat(result_folder, function, dim)
    x0 = problem.initial_solution if x0_mode == "zero" else problem.initial_solution_proposal
    info = {}
    error = None
    try:
        with clock.measuring() if clock else contextlib.nullcontext():
            info = RUNNERS[solver](problem, x0, budget - problem.evaluations, f_opt + FINAL_TARGET, seed,
                                   **({"suite": suite} if suite != "bbob" else {}))
    except Exception as e:  # a crash is a result of this benchmark, not the end of it
        error = f"{type(e).__name__}: {e}"
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    delta = coco_suites.best_delta(suite, problem, f_opt, dat_path(result_folder, function, dim))
    record = {
        "suite": suite, "solver": solver, "id": problem.id, "dim": dim, "function": function, "instance": instance, "seed": seed,
        "f_opt": f_opt, "best_delta": delta, "hits": hits(delta),
        "final_target_hit": coco_suites.final_hit(suite, bool(problem.final_target_hit), delta, FINAL_TARGET),
        "evaluations": int(problem.evaluations), "budget": budget, "seconds": seconds,
        "cpu_seconds": cpu_seconds, **info,
    }
    if clock:
        record["compile_s"] = clock.seconds - compile_before[0]
        record["compiles"] = clock.compiles - compile_before[1]
    if error:
        record["error"] = error
    if not coco_suites.agrees(suite, bool(problem.final_target_hit), delta, FINAL_TARGET):
        raise AssertionError(f"{problem.id}: cocoex says final_target_hit={problem.final_target_hit}, but best "
                             f"f - f_opt = {delta:.3e} with f_opt = {f_opt} read from COCO's .dat header")
    return record


# --------------------------------------------------------------------------- the sweep


def summarise(records: list[dict], solvers: list[str], dim: int) -> dict:
    """One row per dimension: per solver, solved fraction, seconds, evaluations, final targets hit."""
    row: dict = {"dim": dim}
    for solver in solvers:
        mine = [r for r in records if r["solver"] == solver and r["dim"] == dim]
        if not mine:
            continue
        row[solver] = {
            "problems": len(mine),
            "solved": sum(r["hits"] for r in mine) / (len(mine) * len(TARGETS)),
            "seconds": sum(r["seconds"] for r in mine),
            "cpu_seconds": sum(r["cpu_seconds"] for r in mine),
            "evaluations": sum(r["evaluations"] for r in mine),
            "final_hits": sum(r["final_target_hit"] for r in mine),
            "errors": sum("error" in r for r in mine),
            "compile_s": sum(r.get("compile_s", 0.0) for r in mine),
        }
    return row


HEADER = ["dimension", "problems", "es solved %", "pycma solved %", "difference (pp)", "es wall s", "pycma wall s",
          "es cpu s", "pycma cpu s", "es evaluations", "pycma evaluations", "es compile s", "1e-8 hit es / pycma"]


def table_row(row: dict) -> list:
    """A row of ``HEADER``; a solver absent from ``row`` reads n/a."""

    def cell(solver, key, fmt):
        return fmt(row[solver][key]) if solver in row else "n/a"

    both = "es" in row and "pycma" in row
    return [row["dim"], max((row[s]["problems"] for s in SOLVERS if s in row), default=0),
            cell("es", "solved", lambda v: f"{100 * v:.1f}"), cell("pycma", "solved", lambda v: f"{100 * v:.1f}"),
            f"{100 * (row['es']['solved'] - row['pycma']['solved']):+.1f}" if both else "n/a",
            cell("es", "seconds", lambda v: f"{v:,.0f}"), cell("pycma", "seconds", lambda v: f"{v:,.0f}"),
            cell("es", "cpu_seconds", lambda v: f"{v:,.0f}"), cell("pycma", "cpu_seconds", lambda v: f"{v:,.0f}"),
            cell("es", "evaluations", lambda v: f"{v:.3g}"), cell("pycma", "evaluations", lambda v: f"{v:.3g}"),
            cell("es", "compile_s", lambda v: f"{v:,.1f}"),
            f"{cell('es', 'final_hits', str)} / {cell('pycma', 'final_hits', str)}"]


def total_row(rows: list[dict]) -> dict:
    """All dimensions together: solved fractions weighted by problems, the rest summed."""
    total: dict = {"dim": "all"}
    for solver in SOLVERS:
        present = [r[solver] for r in rows if solver in r]
        if present:
            problems = sum(p["problems"] for p in present)
            total[solver] = {
                "problems": problems,
                "solved": sum(p["solved"] * p["problems"] for p in present) / problems,
                **{k: sum(p[k] for p in present) for k in ("seconds", "cpu_seconds", "evaluations", "final_hits",
                                                            "errors", "compile_s")},
            }
    return total


def table(rows: list[dict]) -> str:
    """The markdown table of the per-dimension rows (and their total when there are several)."""
    lines = [table_row(row) for row in rows]
    if len(rows) > 1:
        lines.append(table_row(total_row(rows)))
    text = markdown_table(HEADER, lines)
    errors = {s: sum(r[s]["errors"] for r in rows if s in r) for s in SOLVERS}
    if any(errors.values()):
        text += "\n\nruns that raised (counted with what they had reached): " + ", ".join(
            f"{s} {n}" for s, n in errors.items() if n)
    return text


def sweep(dims, functions, instances, solvers, budget_multiplier: float, coco_dir: str, tag: str, seed: int,
          x0_mode: str, out: str | None, log=print, suite: str = "bbob") -> dict:
    """Run every solver on every problem; write the rows (and COCO's folders) as dimensions complete."""
    import cocoex

    os.makedirs(coco_dir, exist_ok=True)
    for solver in solvers:  # imported before any clock starts
        __import__({"es": "es", "pycma": "cma"}[solver])
    if "es" in solvers:
        import jax

        jax.block_until_ready(jax.numpy.zeros(1))  # JAX's backend starts before any clock, too
    observers = {s: cocoex.Observer(suite, f"result_folder: {tag}-{s} algorithm_name: {s}-bipop "
                                             f"outer_folder: {os.path.abspath(coco_dir)}") for s in solvers}
    folders = {s: observers[s].result_folder for s in solvers}
    problems_log = os.path.join(coco_dir, f"{tag}-problems.jsonl")
    log(f"COCO data: {', '.join(f'{s}: {f}' for s, f in folders.items())}; per-problem records: {problems_log}")
    config = {"suite": suite, "dims": list(dims), "functions": list(functions), "instances": list(instances), "solvers": list(solvers),
              "budget_multiplier": budget_multiplier, "sigma0": SIGMA0, "x0": x0_mode, "seed": seed,
              "pycma_restarts": PYCMA_RESTARTS, "targets": "10^(2 - k/5), k = 0..50", "coco_folders": folders}
    records: list[dict] = []
    rows: list[dict] = []
    started = time.perf_counter()
    with CompileClock() if "es" in solvers else contextlib.nullcontext() as clock:
        for dim in dims:
            options = (f"dimensions:{dim} instance_indices:{','.join(map(str, instances))} "
                       f"function_indices:{','.join(map(str, functions))}")
            suites = {s: cocoex.Suite(suite, "", options) for s in solvers}
            budget = int(budget_multiplier * dim)
            for index in range(len(suites[solvers[0]])):
                order = solvers if index % 2 == 0 else solvers[::-1]  # neither always runs first
                line = []
                for solver in order:
                    problem = suites[solver].get_problem(index)
                    problem.observe_with(observers[solver])
                    record = solve(solver, problem, folders[solver], budget,
                                   problem_seed(seed, dim, problem.id_function, problem.id_instance), x0_mode,
                                   clock if solver == "es" else None, suite)
                    problem.free()
                    records.append(record)
                    with open(problems_log, "a") as f:
                        f.write(json.dumps(record) + "\n")
                    line.append(f"{solver} {record['hits']:2d}/{len(TARGETS)} {record['evaluations']:>7d} evals "
                                f"{record['seconds']:6.1f} s" + (f" ({record['error']})" if "error" in record else ""))
                ids = {r["id"] for r in records[-len(order):]}
                assert len(ids) == 1, f"the solvers got different problems: {ids}"
                log(f"{ids.pop()}: " + " | ".join(line))
            rows.append(summarise(records, solvers, dim))
            if out:
                write_results(out, rows, table(rows), {**config, "seconds": time.perf_counter() - started})
    return {"rows": rows, "records": records, "folders": folders, "config": config}


def report(paths: list[str]) -> list[dict]:
    """The per-dimension rows of the per-problem records in ``paths`` (JSON lines written by ``sweep``).

    A problem recorded more than once counts once (its last record: later paths and lines win), and only the
    problems that every solver ran count, so that split or resumed sweeps compare the solvers like for like."""
    latest = {}
    for path in paths:
        for line in open(path):
            if line.strip():
                record = json.loads(line)
                latest[record["solver"], record["id"]] = record
    solvers = [s for s in SOLVERS if any(solver == s for solver, _ in latest)]
    shared = set.intersection(*({i for s, i in latest if s == solver} for solver in solvers)) if solvers else set()
    records = [r for (_, i), r in latest.items() if i in shared]
    return [summarise(records, solvers, dim) for dim in sorted({r["dim"] for r in records})]


# --------------------------------------------------------------------------- cocopp


def cocopp_solved(folder: str) -> dict[int, float]:
    """Per dimension, the solved fraction of ``TARGETS`` as cocopp computes it from a COCO folder.

    ``DataSet.detEvals(targets)`` gives, per target, each run's evaluations to reach it (NaN: not reached)."""
    import cocopp

    with contextlib.redirect_stdout(None), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "less than 15 instances", "not consistent": fine for a subset
        datasets = cocopp.load(folder)
    reached: dict[int, list[int]] = {}
    for ds in datasets:
        evals = ds.detEvals(list(TARGETS))
        counts = reached.setdefault(int(ds.dim), [0, 0])
        counts[0] += sum(int(np.isfinite(e).sum()) for e in evals)
        counts[1] += sum(len(e) for e in evals)
    return {dim: hit / total for dim, (hit, total) in sorted(reached.items())}


def postprocess(folders: list[str], outdir: str, log=print) -> list[str]:
    """cocopp's figures of ``folders`` into ``outdir``; returns the runtime-ECDF figures over all functions."""
    import cocopp

    for folder in folders:
        log(f"cocopp's solved fractions in {folder}: " + ", ".join(
            f"{dim}D {100 * v:.1f}%" for dim, v in cocopp_solved(folder).items()))
    cocopp.genericsettings.interactive_mode = False
    cocopp.genericsettings.figure_file_formats = ["svg", "png"]
    cocopp.main(["-o", outdir, *folders])
    # over all functions: pprldmany_<D>D_noiselessall.* when comparing algorithms, pprldmany.* (all dimensions) for one
    figures = sorted(f for f in glob.glob(os.path.join(outdir, "**", "pprldmany*.png"), recursive=True)
                     if re.search(r"noiselessall|pprldmany\.png$", f))
    log("runtime ECDFs over all functions:\n  " + "\n  ".join(figures))
    return figures


# --------------------------------------------------------------------------- command line


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=coco_suites.SUITES, default="bbob",
                        help="COCO's suite (default %(default)s); experiments/bench/coco_suites.py")
    parser.add_argument("--dims", default=None, help="dimensions, e.g. 2,3,5 (default: 2,3,5,10,20 for bbob, "
                                                    "5,10,20 for bbob-mixint, 2,5,10,20 for the others)")
    parser.add_argument("--functions", default=None, help="function indices, e.g. 1-5,8 (default: all the suite's: "
                                                         "1-24, bbob-constrained 1-54, bbob-noisy 1-30)")
    parser.add_argument("--instances", default="1-15", help="instance indices, e.g. 1-3 (default %(default)s)")
    parser.add_argument("--budget-multiplier", type=float, default=BUDGET_MULTIPLIER,
                        help="evaluations per problem = this x D (default %(default)g)")
    parser.add_argument("--solvers", default="es,pycma", help="comma-separated, of es and pycma (default %(default)s)")
    parser.add_argument("--x0", choices=("zero", "proposal"), default="zero",
                        help="zero: the problem's initial solution for every restart; proposal: "
                             "problem.initial_solution_proposal, a callable (random restarts)")
    parser.add_argument("--seed", type=int, default=1, help="base of the per-problem seeds (default %(default)s)")
    parser.add_argument("--out", default=None, help="JSON results path; its .md gets the table (default "
                                                    "experiments/bench/results/coco.json; with --report: none)")
    parser.add_argument("--coco-dir", default=os.path.join(RESULTS, "coco"),
                        help="where COCO's data folders go (default %(default)s)")
    parser.add_argument("--tag", default=None, help="prefix of the COCO folders (default: the time)")
    parser.add_argument("--cocopp", action="store_true", help="after the sweep, run cocopp on the folders")
    parser.add_argument("--postprocess", nargs="+", metavar="FOLDER", default=None,
                        help="only run cocopp on these COCO folders (and cross-check the solved fractions)")
    parser.add_argument("--compilation-cache", metavar="DIR", default=None,
                        help="JAX's persistent compilation cache directory, shared by the processes of a split "
                             "sweep (default: none)")
    parser.add_argument("--report", nargs="+", metavar="JSONL", default=None,
                        help="only print the table of these per-problem records (<coco-dir>/<tag>-problems.jsonl "
                             "of one or more sweeps, e.g. the dimensions of a sweep split over processes)")
    args = parser.parse_args(argv)
    if args.report:
        rows = report(args.report)
        if args.out:
            write_results(args.out, rows, table(rows), {"problems_records": args.report})
        else:
            print(table(rows))
        return

    ppdir = os.path.join(args.coco_dir, "ppdata")
    if args.postprocess:
        postprocess(args.postprocess, ppdir)
        return
    solvers = [s.strip() for s in args.solvers.split(",") if s.strip()]
    unknown = set(solvers) - set(SOLVERS)
    if unknown or not solvers:
        parser.error(f"--solvers: choose among {', '.join(SOLVERS)}, got {args.solvers!r}")
    if "es" in solvers and not es_available():
        print(f"{ES_UNAVAILABLE}: running {', '.join(s for s in solvers if s != 'es') or 'nothing'} only")
        solvers = [s for s in solvers if s != "es"]
        if not solvers:
            return
    use_compilation_cache(args.compilation_cache)
    print(machine_description())
    suite = args.suite
    dims = parse_indices(args.dims or ",".join(map(str, coco_suites.dims(suite))))
    result = sweep(dims, parse_indices(args.functions or coco_suites.functions(suite)), parse_indices(args.instances),
                   solvers, args.budget_multiplier, args.coco_dir, args.tag or time.strftime("%Y%m%d-%H%M%S"),
                   args.seed, args.x0, args.out or os.path.join(RESULTS, "coco.json" if suite == "bbob" else
                                                                 f"coco-{suite}.json"), suite=suite)
    if args.cocopp:
        postprocess(list(result["folders"].values()), ppdir)


if __name__ == "__main__":
    main()
