"""A sweep as one program: ``es.evolve_many`` against separate ``es.evolve`` calls, compilation included.

    python -m experiments.bench.sweeps                     # CartPole-v1 and 1,000-D Rastrigin, 3 repeats
    python -m experiments.bench.sweeps --problems cartpole --repeats 1

Each problem runs 16 runs of OpenAI-ES (8 seeds x 2 sigmas, popsize 64,
``adam(0.03)``) from the seeds' ``experiments.config.initial_state``:

- **evolve_many**: one ``es.evolve_many`` call over the 16 runs (one
  compilation);
- **separate**: 16 ``es.evolve`` calls one after another in one process (one
  compilation per sigma, the seeds of a sigma reuse it).

Every measurement is a fresh child process (no compilation cache, in memory
or on disk), so both timings include compilation; the children alternate,
the order flipping every repeat, and the medians are compared. Each child
also times its work a second time, compiled, and reports a digest of every
run's final params, so the table says whether the two variants ended
bit-identical. Target: evolve_many at least 3x faster on CartPole-v1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time

from experiments.bench.common import machine_description, markdown_table, median, peak_rss_bytes, run_child

TARGET_SPEEDUP = 3.0
PROBLEMS = {
    "cartpole": {"task": "CartPole-v1", "options": {}, "generations": 50},
    "rastrigin": {"task": "rastrigin", "options": {"dim": 1000}, "generations": 200},
}
SEEDS = tuple(range(8))
SIGMAS = (0.05, 0.1)
POPSIZE = 64
VARIANTS = ("evolve_many", "separate")


def child(variant: str, problem: str, generations: int) -> None:
    """Run one variant in this process and print its timings as one JSON line."""
    from experiments.devices import emulate_cpu_devices

    emulate_cpu_devices()

    import jax
    import numpy as np
    import optax

    import es
    import tasks
    from experiments import config as config_lib

    spec = PROBLEMS[problem]
    task = tasks.make(spec["task"], **spec["options"])
    strategies = {sigma: es.OpenES(popsize=POPSIZE, sigma=sigma, optimizer=optax.adam(0.03)) for sigma in SIGMAS}
    runs = [(strategies[sigma], seed) for sigma in SIGMAS for seed in SEEDS]
    states = [config_lib.initial_state(task, strategy, seed)[1] for strategy, seed in runs]
    mesh = es.make_mesh(popsize=POPSIZE)

    def evolve_many():
        return es.evolve_many([strategy for strategy, _ in runs], task.fitness, states, generations, mesh=mesh)[0]

    def separate():
        return [es.evolve(strategy, task.fitness, state, generations, mesh=mesh)[0]
                for (strategy, _), state in zip(runs, states)]

    work = {"evolve_many": evolve_many, "separate": separate}[variant]
    start = time.perf_counter()
    finals = jax.block_until_ready(work())
    first = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(work())
    compiled = time.perf_counter() - start
    digests = [hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in jax.tree.leaves(f.params))).hexdigest()[:16]
               for f in finals]
    print(json.dumps({"variant": variant, "problem": problem, "first_s": first, "compiled_s": compiled,
                      "devices": mesh.size, "peak_rss_gib": peak_rss_bytes() / 2**30, "digests": digests,
                      "best_fitness": [float(f.best_fitness) for f in finals]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", nargs="+", choices=list(PROBLEMS), default=list(PROBLEMS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--generations", type=int, default=None, help="override every problem's generations")
    parser.add_argument("--child", nargs=3, metavar=("VARIANT", "PROBLEM", "GENERATIONS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        variant, problem, generations = args.child
        child(variant, problem, int(generations))
        return

    env = {"JAX_ENABLE_COMPILATION_CACHE": "false"}
    print(machine_description(), flush=True)
    rows, results = [], {}
    for problem in args.problems:
        spec = PROBLEMS[problem]
        generations = args.generations or spec["generations"]
        measured = {variant: [] for variant in VARIANTS}
        for repeat in range(args.repeats):
            for variant in VARIANTS if repeat % 2 == 0 else VARIANTS[::-1]:
                result = run_child("experiments.bench.sweeps", ["--child", variant, problem, str(generations)],
                                   timeout=3600, env=env)
                if "error" in result:
                    sys.exit(f"{problem} {variant}: {result['error']}")
                measured[variant].append(result)
                print(f"  {problem} {variant}: {result['first_s']:.2f} s incl. compilation, "
                      f"{result['compiled_s']:.2f} s compiled", flush=True)
        many, separate = measured["evolve_many"], measured["separate"]
        first = {v: median([r["first_s"] for r in measured[v]]) for v in VARIANTS}
        compiled = {v: median([r["compiled_s"] for r in measured[v]]) for v in VARIANTS}
        identical = all(m["digests"] == s["digests"] for m in many for s in separate)
        speedup = first["separate"] / first["evolve_many"]
        results[problem] = {"generations": generations, "devices": many[0]["devices"], "first_s": first,
                            "compiled_s": compiled, "speedup_incl_compilation": speedup,
                            "speedup_compiled": compiled["separate"] / compiled["evolve_many"],
                            "bit_identical": identical, "all": measured}
        task = f"{spec['task']} {spec['options'] or ''}".strip()
        rows.append([
            task, generations, f"{first['separate']:.1f}", f"{first['evolve_many']:.1f}", f"{speedup:.2f}x",
            f"{compiled['separate']:.1f}", f"{compiled['evolve_many']:.1f}",
            f"{compiled['separate'] / compiled['evolve_many']:.2f}x",
            f"{median([r['peak_rss_gib'] for r in separate]):.2f} / {median([r['peak_rss_gib'] for r in many]):.2f}",
            "yes" if identical else "no",
        ])
    print(f"16 runs (seeds 0-7 x sigma {SIGMAS[0]}, {SIGMAS[1]}), OpenES popsize {POPSIZE}, "
          f"{results[args.problems[0]]['devices']} device(s), medians of {args.repeats} fresh processes each")
    print(markdown_table(
        ["problem", "generations", "16 x es.evolve s (incl. compile)", "es.evolve_many s (incl. compile)",
         "speedup", "16 x es.evolve s (compiled)", "es.evolve_many s (compiled)", "speedup (compiled)",
         "peak RSS GiB (separate / many)", "bit-identical"],
        rows,
    ))
    if "cartpole" in results:
        speedup = results["cartpole"]["speedup_incl_compilation"]
        verdict = "meets" if speedup >= TARGET_SPEEDUP else "MISSES"
        print(f"CartPole-v1: evolve_many {speedup:.2f}x faster including compilation; {verdict} the "
              f">= {TARGET_SPEEDUP:.0f}x target")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
