"""How much of an ``es.minimize`` BIPOP run goes to compilation, in a fresh process.

    python -m experiments.bench.restarts                      # 10-D Rastrigin and Rosenbrock, BIPOP, 3 seeds
    python -m experiments.bench.restarts --dim 5 --max-evals 50000

Every new popsize is a new compiled program (the arrays change shape); programs are cached for the life of
the process, so a popsize that recurs compiles nothing. This script runs ``es.minimize(..., restarts="bipop")``
on a Python objective (the ask/tell path COCO takes) one call after another in one process and sums, from
JAX's own monitoring events, the seconds spent tracing, lowering and compiling
(``/jax/core/compile/*_duration``) against the wall time of each call. The first call pays for every
program it needs; later calls show what a process that has seen the popsizes before pays.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


def rastrigin(x: np.ndarray) -> float:
    return float(10 * len(x) + np.sum(x**2 - 10 * np.cos(2 * np.pi * x)))


def rosenbrock(x: np.ndarray) -> float:
    return float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2))


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--max-evals", type=int, default=None, help="default: 1e4 * dim")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)

    import jax

    import es

    compiling = {"s": 0.0}

    def listen(event: str, duration: float, **kwargs) -> None:
        if event in COMPILE_EVENTS:
            compiling["s"] += duration

    jax.monitoring.register_event_duration_secs_listener(listen)
    budget = args.max_evals or 10_000 * args.dim
    rows = []
    print(f"es.minimize, BIPOP, {args.dim}-D, budget {budget} evaluations, x0 = 3, sigma0 = 2, one process")
    print("| call | function | seed | wall s | compiling s | share | runs | popsizes | nfev | f |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for call, (name, fun) in enumerate([(f"{f.__name__}", f) for f in (rastrigin, rosenbrock)] * args.seeds):
        seed = call // 2
        before, start = compiling["s"], time.perf_counter()
        result = es.minimize(fun, np.full(args.dim, 3.0), 2.0, max_evals=budget, target=1e-8, restarts="bipop",
                             seed=seed)
        wall, compiled = time.perf_counter() - start, compiling["s"] - before
        sizes = sorted({run.popsize for run in result.restarts})
        rows.append({"function": name, "seed": seed, "wall_s": wall, "compile_s": compiled, "runs": len(result.restarts),
                     "popsizes": sizes, "nfev": result.nfev, "fun": result.fun})
        print(f"| {call} | {name} | {seed} | {wall:.2f} | {compiled:.2f} | {compiled / wall:.0%} | "
              f"{len(result.restarts)} | {sizes} | {result.nfev} | {result.fun:.2e} |")
    total_wall, total_compile = sum(r["wall_s"] for r in rows), sum(r["compile_s"] for r in rows)
    print(f"all calls: {total_wall:.1f} s, of which compiling {total_compile:.1f} s ({total_compile / total_wall:.0%})")
    return rows


if __name__ == "__main__":
    main()
