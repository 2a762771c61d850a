"""Every es strategy against its evosax counterpart, side by side: final quality and seconds per generation.

    python -m experiments.bench.strategies                 # the full grid (30-40 min on 2 shared CPU cores)
    python -m experiments.bench.strategies --quick         # a smoke subset (a few minutes)
    python -m experiments.bench.strategies --out /tmp/strategies.json   # also writes /tmp/strategies.md
    python -m experiments.bench.strategies --no-quality --speed 1000000x1024   # one speed cell per strategy

Pairs (``PAIRS``): ``es.OpenES`` / ``Open_ES``, ``es.SNES`` / ``SNES``,
``es.PGPE`` / ``PGPE``, ``es.ARS`` / ``ARS``, ``es.SepCMAES`` /
``Sep_CMA_ES`` (evosax 0.3.2). Each library keeps its own defaults (optimizer,
learning rates, shaping, elite ratio, ...) except two settings that both get
the same value: the popsize and the initial scale ``sigma``
(``SIGMA_FRACTION`` of the search box's width; evosax's ``std_init``, or its
constant ``std_schedule`` for Open_ES and ARS).

Quality cells: the benchmark functions of ``tasks`` (``FUNCTIONS``) at 10, 100
and 1,000 dimensions, ``SEEDS`` seeds each. Seed ``s`` draws the initial mean
with ``task.init_params(key(s))`` (the same for both libraries: uniform in
the search box) and runs ``GENERATIONS[dim]`` generations of popsize
``POPSIZE[dim]``. The score is the gap ``f(mean) - f*`` of the final mean,
evaluated in float64 (float32 rounding alone would blur gaps below ~1e-2 on
1,000-dimensional Styblinski-Tang) at the mean projected onto the search box
(neither library constrains the search, and Schwefel's function is unbounded
below outside its box; the runs whose mean left it are counted). Each
library's run (initialisation and all generations) is one
``jax.jit``-compiled call, compiled once per cell and called once per seed,
the two libraries alternating; seconds per generation are the median call
time over the seeds divided by the generations. evosax
runs the way a competent user writes it: ``lax.scan`` over ask / vmapped
function / tell, as in ``experiments/bench/suite.py``.

"No worse" (``verdict``): with ``g`` the median gap over seeds,
``g_es <= (1 + REL_TOL) * g_evosax + ABS_TOL``; "better" is the mirror
image, and a cell that is neither is a "loss". A non-finite final mean counts
as an infinite gap. With 5 seeds a median moves by more than 5% from seed
noise alone (our SNES and evosax's share their update rule, yet either may
"lose" a cell), so each loss also gets the one-sided exact
Mann-Whitney p-value of "our gaps are larger" over the seeds, and the score
counts the losses with p < ``SIGNIFICANCE``.

Speed cells: the sphere at 1e5 params, popsize 1,024 (``SPEED``), every
pair; each library's program of ``SPEED_GENERATIONS`` generations is
compiled once and timed in alternation for ``--rounds`` rounds (medians).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time

from experiments.bench.common import machine_description, markdown_table, median

PAIRS = {"OpenES": "Open_ES", "SNES": "SNES", "PGPE": "PGPE", "ARS": "ARS", "SepCMAES": "Sep_CMA_ES"}
FUNCTIONS = ("sphere", "ellipsoid", "rosenbrock", "rastrigin", "ackley", "griewank", "schwefel", "styblinski_tang")
DIMS = (10, 100, 1000)
POPSIZE = {10: 32, 100: 64, 1000: 128}
GENERATIONS = {10: 500, 100: 500, 1000: 500}
SEEDS = 5
SIGMA_FRACTION = 0.1
REL_TOL = 0.05
ABS_TOL = 1e-6
SIGNIFICANCE = 0.05
SPEED = (100_000, 1024)
SPEED_GENERATIONS = 3
QUICK = {"functions": ("sphere", "rastrigin"), "dims": (10,), "seeds": 2, "generations": 50,
         "speed": (10_000, 128)}
RESULTS = os.path.join(os.path.dirname(__file__), "results")


@dataclasses.dataclass(frozen=True)
class Cell:
    """One quality cell: a strategy pair on one function at one dimension."""

    strategy: str
    function: str
    dim: int
    popsize: int
    generations: int
    sigma: float


def cell_for(strategy: str, function: str, dim: int, generations: int | None = None) -> Cell:
    import tasks

    task = tasks.make(function, dim=dim)
    return Cell(strategy, function, dim, POPSIZE.get(dim, 32), generations or GENERATIONS.get(dim, 100),
                SIGMA_FRACTION * float(task.upper - task.lower))


# --------------------------------------------------------------------------- the two libraries


def ours(strategy: str, popsize: int, sigma: float):
    """Our strategy with its defaults, but this popsize and initial scale."""
    import es

    return es.STRATEGIES[strategy](popsize=popsize, sigma=sigma)


def theirs(strategy: str, popsize: int, sigma: float, solution):
    """``(algorithm, hyperparams)``: evosax's counterpart with its defaults, but this popsize and initial scale."""
    import optax
    from evosax import algorithms

    cls = getattr(algorithms, PAIRS[strategy])
    if strategy in ("OpenES", "ARS"):  # their scale is a schedule, constant by default
        algorithm = cls(population_size=popsize, solution=solution, std_schedule=optax.constant_schedule(sigma))
        return algorithm, algorithm.default_params
    algorithm = cls(population_size=popsize, solution=solution)
    return algorithm, algorithm.default_params.replace(std_init=sigma)


def our_program(strategy: str, popsize: int, sigma: float, fitness, generations: int, params):
    """jit-compiled ``(params, key) -> final mean`` of our strategy."""
    import jax

    import es

    algorithm = ours(strategy, popsize, sigma)

    def run(params, key):
        state = algorithm.init(key, params)
        state, _ = es.evolve(algorithm, fitness, state, generations)
        return state.params

    return jax.jit(run).lower(params, jax.random.key(0)).compile()


def their_program(strategy: str, popsize: int, sigma: float, function, generations: int, params):
    """jit-compiled ``(params, key) -> final mean`` of evosax's counterpart (``lax.scan`` of ask / tell)."""
    import jax

    algorithm, hyperparams = theirs(strategy, popsize, sigma, params)
    evaluate = jax.vmap(function)  # evosax minimises

    def run(params, key):
        init_key, scan_key = jax.random.split(key)
        state = algorithm.init(init_key, params, hyperparams)

        def generation(state, key):
            ask_key, tell_key = jax.random.split(key)
            population, state = algorithm.ask(ask_key, state, hyperparams)
            state, _ = algorithm.tell(tell_key, population, evaluate(population), state, hyperparams)
            return state, None

        state, _ = jax.lax.scan(generation, state, jax.random.split(scan_key, generations))
        return state.mean

    return jax.jit(run).lower(params, jax.random.key(0)).compile()


def timed_call(program, *args):
    """``(result as numpy, seconds)`` of one blocking call."""
    import jax
    import numpy as np

    start = time.perf_counter()
    result = jax.block_until_ready(program(*args))
    return np.asarray(result), time.perf_counter() - start


def gap(task, mean) -> float:
    """``f(clip(mean)) - f*`` in float64: the mean projected onto the search box (``inf`` if not finite)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    mean = np.asarray(mean, np.float64)
    if not np.all(np.isfinite(mean)):
        return math.inf
    mean = np.clip(mean, task.lower, task.upper)  # Schwefel's f is unbounded below outside its box
    with jax.enable_x64(True):
        value = float(task.function(jnp.asarray(mean, jnp.float64))) - task.optimal_value()
    return value if math.isfinite(value) else math.inf


def outside(task, mean) -> bool:
    """Whether ``mean`` left the search box (it is then scored at its projection, see ``gap``)."""
    import numpy as np

    mean = np.asarray(mean)
    return bool(np.any(mean < task.lower) or np.any(mean > task.upper))


def run_cell(cell: Cell, seeds: int) -> dict:
    """Both libraries on one cell: gaps per seed, median gap, seconds per generation, compile seconds."""
    import jax

    import tasks

    task = tasks.make(cell.function, dim=cell.dim)
    params = task.init_params(jax.random.key(0))
    start = time.perf_counter()
    programs = {"es": our_program(cell.strategy, cell.popsize, cell.sigma, task.fitness, cell.generations, params)}
    compile_es = time.perf_counter() - start
    programs["evosax"] = their_program(cell.strategy, cell.popsize, cell.sigma, task.function, cell.generations, params)
    compile_s = {"es": compile_es, "evosax": time.perf_counter() - start - compile_es}
    out = {name: {"gaps": [], "seconds": [], "outside": 0, "compile_s": compile_s[name]} for name in programs}
    for seed in range(seeds):
        init = task.init_params(jax.random.key(seed))
        key = jax.random.key(10_000 + seed)
        for name in (("es", "evosax") if seed % 2 == 0 else ("evosax", "es")):  # alternate who goes first
            mean, seconds = timed_call(programs[name], init, key)
            out[name]["gaps"].append(gap(task, mean))
            out[name]["outside"] += outside(task, mean)
            out[name]["seconds"].append(seconds)
    for record in out.values():
        record["median_gap"] = median(record["gaps"])
        record["s_per_gen"] = median(record["seconds"]) / cell.generations
    return {**dataclasses.asdict(cell), **out, "verdict": verdict(out["es"]["median_gap"], out["evosax"]["median_gap"]),
            "p_worse": p_worse(out["es"]["gaps"], out["evosax"]["gaps"])}


def run_speed(strategy: str, dim: int, popsize: int, generations: int, rounds: int) -> dict:
    """Seconds per generation of both libraries on the sphere at ``dim x popsize``, timed in alternation."""
    import jax
    import jax.numpy as jnp

    params = jnp.full((dim,), 0.5, jnp.float32)
    programs = {
        "es": our_program(strategy, popsize, 0.01, lambda x, key: -jnp.sum(x * x), generations, params),
        "evosax": their_program(strategy, popsize, 0.01, lambda x: jnp.sum(x * x), generations, params),
    }
    key = jax.random.key(0)
    for program in programs.values():
        timed_call(program, params, key)  # warm up
    seconds = {name: [] for name in programs}
    for round_index in range(rounds):
        for name in (("es", "evosax") if round_index % 2 == 0 else ("evosax", "es")):
            seconds[name].append(timed_call(programs[name], params, key)[1])
    per_gen = {name: median(values) / generations for name, values in seconds.items()}
    return {"strategy": strategy, "params": dim, "popsize": popsize, "generations": generations, "rounds": rounds,
            "es_s_per_gen": per_gen["es"], "evosax_s_per_gen": per_gen["evosax"],
            "speedup": per_gen["evosax"] / per_gen["es"]}


# --------------------------------------------------------------------------- verdicts and tables


def verdict(ours_gap: float, their_gap: float, rel_tol: float = REL_TOL, abs_tol: float = ABS_TOL) -> str:
    """``"better"``, ``"tie"`` or ``"loss"`` for our median gap against theirs (see the module docstring)."""
    no_worse = ours_gap <= (1 + rel_tol) * their_gap + abs_tol
    no_better = their_gap <= (1 + rel_tol) * ours_gap + abs_tol
    if no_worse and not no_better:
        return "better"
    return "tie" if no_worse else "loss"


def p_worse(ours_gaps: list[float], their_gaps: list[float]) -> float:
    """One-sided exact Mann-Whitney p-value of "our gaps are larger than theirs" (1.0 when all are equal)."""
    from scipy.stats import mannwhitneyu

    finite = [[g if math.isfinite(g) else 1e300 for g in gaps] for gaps in (ours_gaps, their_gaps)]
    if len(set(finite[0] + finite[1])) == 1:
        return 1.0
    return float(mannwhitneyu(*finite, alternative="greater", method="exact").pvalue)


def score(cells: list[dict]) -> dict:
    """Counts of better / tie / loss, the no-worse fraction, and losses significant at p < ``SIGNIFICANCE``."""
    counts = {v: sum(c["verdict"] == v for c in cells) for v in ("better", "tie", "loss")}
    significant = sum(c["verdict"] == "loss" and c.get("p_worse", 1.0) < SIGNIFICANCE for c in cells)
    return {**counts, "cells": len(cells), "no_worse": (counts["better"] + counts["tie"]) / max(1, len(cells)),
            "significant_losses": significant}


def fmt_gap(value: float) -> str:
    return "inf" if not math.isfinite(value) else f"{value:.2g}"


MARK = {"better": "+", "tie": "=", "loss": "**-**"}


def quality_table(cells: list[dict], dim: int) -> str:
    """Rows: functions; columns: strategies; each cell ``es / evosax mark`` (median gaps)."""
    strategies = [s for s in PAIRS if any(c["strategy"] == s for c in cells)]
    rows = []
    for function in dict.fromkeys(c["function"] for c in cells if c["dim"] == dim):
        row = [function]
        for strategy in strategies:
            match = [c for c in cells if (c["function"], c["dim"], c["strategy"]) == (function, dim, strategy)]
            if not match:
                row.append("-")
                continue
            c = match[0]
            row.append(f"{fmt_gap(c['es']['median_gap'])} / {fmt_gap(c['evosax']['median_gap'])} {MARK[c['verdict']]}")
        rows.append(row)
    return markdown_table(["function", *(f"{s} / {PAIRS[s]}" for s in strategies)], rows)


def score_table(cells: list[dict]) -> str:
    strategies = [s for s in PAIRS if any(c["strategy"] == s for c in cells)]
    rows = []
    for strategy in [*strategies, None]:
        mine = [c for c in cells if strategy is None or c["strategy"] == strategy]
        s = score(mine)
        rows.append([strategy or "**all**", s["cells"], s["better"], s["tie"], s["loss"], s["significant_losses"],
                     f"{100 * s['no_worse']:.0f}%"])
    return markdown_table(["strategy", "cells", "es better", "tie", "es worse", f"of which p < {SIGNIFICANCE}",
                           "no worse"], rows)


def time_table(cells: list[dict]) -> str:
    """Median over functions of seconds per generation, per strategy and dimension."""
    strategies = [s for s in PAIRS if any(c["strategy"] == s for c in cells)]
    dims = sorted({c["dim"] for c in cells})
    rows = []
    for strategy in strategies:
        for dim in dims:
            mine = [c for c in cells if c["strategy"] == strategy and c["dim"] == dim]
            if not mine:
                continue
            es_t = median([c["es"]["s_per_gen"] for c in mine])
            ev_t = median([c["evosax"]["s_per_gen"] for c in mine])
            rows.append([strategy, dim, mine[0]["popsize"], f"{1e3 * es_t:.3g}", f"{1e3 * ev_t:.3g}", f"{ev_t / es_t:.2f}x",
                         f"{median([c['es']['compile_s'] for c in mine]):.1f}",
                         f"{median([c['evosax']['compile_s'] for c in mine]):.1f}"])
    return markdown_table(["strategy", "dim", "popsize", "es ms/gen", "evosax ms/gen", "es speed-up",
                           "es compile s", "evosax compile s"], rows)


def speed_table(speed: list[dict]) -> str:
    rows = [[s["strategy"], f"{s['params']:,}", f"{s['popsize']:,}", f"{s['es_s_per_gen']:.3g}",
             f"{s['evosax_s_per_gen']:.3g}", f"{s['speedup']:.2f}x", "yes" if s["speedup"] > 1 else "NO"]
            for s in speed]
    return markdown_table(["strategy", "params", "popsize", "es s/gen", "evosax s/gen", "es speed-up", "es faster"], rows)


def quality_sections(result: dict) -> list[str]:
    """The report's lines about the quality cells: one table per dimension, the score, the seconds."""
    cells = result["cells"]
    s = score(cells)
    target = "met" if s["no_worse"] >= 0.8 else "NOT met"
    lines = [
        f"Popsize {result['popsize']} and generations {result['generations']} by dimension; initial scale "
        f"{SIGMA_FRACTION} x the search box's width for both libraries; {result['seeds']} seeds per cell. "
        f"Each cell: median over seeds of the final mean's gap f(mean) - f* (float64), es / evosax, then "
        f"`+` es better, `=` tie, **-** es worse. es is *no worse* when g_es <= (1 + {REL_TOL}) g_evosax + {ABS_TOL:g}.",
        "",
    ]
    for dim in sorted({c["dim"] for c in cells}):
        lines += [f"#### {dim} dimensions", "", quality_table(cells, dim), ""]
    left = {name: sum(c[name].get("outside", 0) for c in cells) for name in ("es", "evosax")}
    lines += [f"Runs whose final mean left the search box (scored at its projection): es {left['es']}, "
              f"evosax {left['evosax']} of {len(cells) * result['seeds']} each.", ""]
    lines += ["#### Score", "", score_table(cells), "",
              f"No worse in {s['better'] + s['tie']} of {s['cells']} cells ({100 * s['no_worse']:.0f}%): "
              f"target >= 80% {target}.", "",
              "#### Seconds per generation on the quality cells (median over functions)", "", time_table(cells), ""]
    return lines


def report(result: dict) -> str:
    cells = result["cells"]
    lines = [f"Machine: {result['machine']}. Total wall time {result['seconds'] / 60:.0f} min.", ""]
    if cells:  # none with --no-quality: the speed cells alone
        lines += quality_sections(result)
    if result.get("speed"):
        lines += [f"#### Speed: sphere, {result['speed'][0]['params']:,} params, popsize "
                  f"{result['speed'][0]['popsize']:,} ({result['speed'][0]['generations']} generations per call, "
                  f"median of {result['speed'][0]['rounds']} alternating rounds)", "", speed_table(result["speed"]), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="sphere and rastrigin at 10 dims, 2 seeds, a small speed cell")
    parser.add_argument("--out", default=None, help="JSON path (default experiments/bench/results/strategies[-quick].json)")
    parser.add_argument("--strategies", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--functions", nargs="+", default=None)
    parser.add_argument("--dims", nargs="+", type=int, default=None)
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of the speed cells")
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--no-quality", action="store_true", help="only the speed cells")
    parser.add_argument("--speed", metavar="PARAMSxPOPSIZE", default=None,
                        help=f"the speed cell's size (default {SPEED[0]}x{SPEED[1]})")
    args = parser.parse_args()

    began = time.perf_counter()
    functions = args.functions or (QUICK["functions"] if args.quick else FUNCTIONS)
    dims = args.dims or (QUICK["dims"] if args.quick else DIMS)
    seeds = args.seeds or (QUICK["seeds"] if args.quick else SEEDS)
    out = args.out or os.path.join(RESULTS, "strategies-quick.json" if args.quick else "strategies.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    machine = machine_description()
    print(f"# es strategies vs evosax ({'quick' if args.quick else 'full'}), machine: {machine}", flush=True)

    cells = []
    for dim in () if args.no_quality else dims:
        for function in functions:
            for strategy in args.strategies:
                cell = cell_for(strategy, function, dim, QUICK["generations"] if args.quick else None)
                cells.append(run_cell(cell, seeds))
                c = cells[-1]
                print(f"{dim:>5} {function:<16} {strategy:<9} gap es {fmt_gap(c['es']['median_gap']):>8} "
                      f"evosax {fmt_gap(c['evosax']['median_gap']):>8} {c['verdict']:<6} ms/gen es "
                      f"{1e3 * c['es']['s_per_gen']:.3g} evosax {1e3 * c['evosax']['s_per_gen']:.3g} "
                      f"[{time.perf_counter() - began:.0f} s]", flush=True)
    speed = []
    if not args.no_speed:
        dim, popsize = QUICK["speed"] if args.quick else SPEED
        if args.speed:
            dim, popsize = (int(float(v)) for v in args.speed.lower().split("x"))
        for strategy in args.strategies:
            speed.append(run_speed(strategy, dim, popsize, SPEED_GENERATIONS, args.rounds))
            print(f"speed {strategy}: es {speed[-1]['es_s_per_gen']:.3g} s/gen, evosax "
                  f"{speed[-1]['evosax_s_per_gen']:.3g} s/gen ({speed[-1]['speedup']:.2f}x) "
                  f"[{time.perf_counter() - began:.0f} s]", flush=True)

    result = {"machine": machine, "quick": args.quick, "seeds": seeds,
              "popsize": {d: POPSIZE.get(d, 32) for d in dims},
              "generations": {d: (QUICK["generations"] if args.quick else GENERATIONS.get(d, 100)) for d in dims},
              "sigma_fraction": SIGMA_FRACTION, "rel_tol": REL_TOL, "abs_tol": ABS_TOL,
              "cells": cells, "score": score(cells), "speed": speed, "seconds": time.perf_counter() - began}
    markdown = report(result)
    print()
    print(markdown)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write(markdown + "\n")
    print(f"wrote {out} and {os.path.splitext(out)[0]}.md", flush=True)


if __name__ == "__main__":
    main()
