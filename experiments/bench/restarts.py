"""How much of an ``es.minimize`` BIPOP run goes to compilation, in a fresh process.

    python -m experiments.bench.restarts                      # 10-D Rastrigin and Rosenbrock, BIPOP, 3 seeds
    python -m experiments.bench.restarts --dim 5 --max-evals 50000
    python -m experiments.bench.restarts --compilation-cache /tmp/jax-cache   # twice: the second process reads
                                                                              # the compiled programs from disk

Every new popsize is a new compiled program (the arrays change shape); programs are cached for the life of
the process, so a popsize that recurs compiles nothing. This script runs ``es.minimize(..., restarts="bipop")``
on a Python objective (the ask/tell path COCO takes), each call twice in a row in one process: the first
time it compiles what it needs (the next large run's programs compile on a background thread while a run
goes on), the second time every program is cached, so the difference of the two wall times is what
compiling cost the first call. JAX's monitoring events (``/jax/core/compile/*_duration``) add up the
compiling itself, on either thread.

``--compilation-cache DIR`` turns on JAX's persistent compilation cache (``jax_compilation_cache_dir``,
every program cached however quick its compile): a second process with the same ``DIR`` loads the compiled
programs instead of compiling them, and what remains of "cost of compiling" is tracing and lowering.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from experiments.bench.common import use_compilation_cache

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
    parser.add_argument("--compilation-cache", metavar="DIR", default=None,
                        help="JAX's persistent compilation cache directory (default: none)")
    args = parser.parse_args(argv)

    import jax

    use_compilation_cache(args.compilation_cache)

    import es

    compiling = {"s": 0.0}

    def listen(event: str, duration: float, **kwargs) -> None:
        if event in COMPILE_EVENTS:
            compiling["s"] += duration

    jax.monitoring.register_event_duration_secs_listener(listen)
    budget = args.max_evals or 10_000 * args.dim
    rows = []
    print(f"es.minimize, BIPOP, {args.dim}-D, budget {budget} evaluations, x0 = 3, sigma0 = 2, one process")
    print("| function | seed | cold wall s | warm wall s | cost of compiling | compiling (any thread) s | runs | popsizes | nfev | f |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, fun in [(f.__name__, f) for f in (rastrigin, rosenbrock)]:
        for seed in range(args.seeds):
            walls, before = [], compiling["s"]
            for _ in range(2):
                start = time.perf_counter()
                result = es.minimize(fun, np.full(args.dim, 3.0), 2.0, max_evals=budget, target=1e-8,
                                     restarts="bipop", seed=seed)
                walls.append(time.perf_counter() - start)
            compiled = compiling["s"] - before
            sizes = sorted({run.popsize for run in result.restarts})
            rows.append({"function": name, "seed": seed, "cold_s": walls[0], "warm_s": walls[1], "compile_s": compiled,
                         "runs": len(result.restarts), "popsizes": sizes, "nfev": result.nfev, "fun": result.fun})
            print(f"| {name} | {seed} | {walls[0]:.2f} | {walls[1]:.2f} | {walls[0] - walls[1]:.2f} s "
                  f"({(walls[0] - walls[1]) / walls[0]:.0%}) | {compiled:.2f} | {len(result.restarts)} | {sizes} | "
                  f"{result.nfev} | {result.fun:.2e} |")
    cold, warm = sum(r["cold_s"] for r in rows), sum(r["warm_s"] for r in rows)
    print(f"all first calls: {cold:.1f} s; the same calls with every program cached: {warm:.1f} s; "
          f"compiling cost the first calls {cold - warm:.1f} s ({(cold - warm) / cold:.0%})")
    return rows


if __name__ == "__main__":
    main()
