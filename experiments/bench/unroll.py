"""What ``es.noise.accumulate.UNROLL`` buys: CPU seconds per generation and compile seconds, side by side.

    python -m experiments.bench.unroll                                   # OpenES and SNES, 7e4 and 1e6 params
    python -m experiments.bench.unroll --unroll 8 4 2 1 --dims 7e4 --strategies OpenES --rounds 3

Each (strategy, noise, params, UNROLL) cell runs in its own child process pinned to one core (``taskset``
where it exists) with one JAX device, in alternating order over ``--rounds`` rounds: es.evolve of popsize 256 on
a sphere, 4 generations per call, compiled ahead of time (compile CPU seconds), then one warm-up call and 3
timed calls (CPU seconds per generation, their median). Reported: the medians over the rounds and each
UNROLL's ratio to the first one given.

The child sets the constant on the module, ``importlib.import_module("es.noise.accumulate").UNROLL``:
``es.noise.UNROLL`` is a copy made at import, and ``es.noise.accumulate`` is the function of that name, so
assigning through either changes nothing that ``accumulate`` reads.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys

from experiments.bench.common import markdown_table, run_command, write_results

RESULTS = os.path.join(os.path.dirname(__file__), "results")
POPSIZE, GENERATIONS, REPEATS = 256, 4, 3
PREFIX = "unroll-result: "


def measure(strategy_name: str, noise_name: str, dim: int, unroll: int) -> dict:
    """In this process: compile CPU s and median CPU s per generation of one cell."""
    import importlib
    import time

    importlib.import_module("es.noise.accumulate").UNROLL = unroll
    import jax
    import jax.numpy as jnp
    import optax

    import es

    noise = {"prng": es.GaussianNoise(), "table": es.NoiseTable(size=2**24, seed=1)}[noise_name]
    strategy = {"OpenES": lambda: es.OpenES(popsize=POPSIZE, sigma=0.05, optimizer=optax.adam(0.01), noise=noise),
                "SNES": lambda: es.SNES(popsize=POPSIZE, sigma=0.05, noise=noise)}[strategy_name]()
    state = strategy.init(jax.random.key(0), jnp.zeros(dim))
    run = jax.jit(lambda s: es.evolve(strategy, lambda x, key: -jnp.sum(x * x), s, GENERATIONS,
                                      mesh=es.make_mesh(1)))
    start = time.process_time()
    compiled = run.lower(state).compile()
    compile_s = time.process_time() - start
    jax.block_until_ready(compiled(state))
    per_generation = []
    for _ in range(REPEATS):
        start = time.process_time()
        jax.block_until_ready(compiled(state))
        per_generation.append((time.process_time() - start) / GENERATIONS)
    return {"compile_s": compile_s, "generation_s": statistics.median(per_generation)}


def child(strategy_name: str, noise_name: str, dim: int, unroll: int) -> dict:
    """``measure`` in a fresh process with one JAX device, on one core where ``taskset`` exists."""
    code = ("import json, sys; from experiments.bench.unroll import PREFIX, measure; "
            "print(PREFIX + json.dumps(measure(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))")
    command = [sys.executable, "-c", code, strategy_name, noise_name, str(dim), str(unroll)]
    if shutil.which("taskset"):
        command = ["taskset", "-c", "0", *command]
    return run_command(command, timeout=1800, env={"JAX_NUM_CPU_DEVICES": "1"}, prefix=PREFIX)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--unroll", type=int, nargs="+", default=[8, 1], help="values compared, the first the base")
    parser.add_argument("--dims", type=float, nargs="+", default=[7e4, 1e6], help="parameter counts")
    parser.add_argument("--strategies", nargs="+", default=["OpenES", "SNES"], choices=["OpenES", "SNES"])
    parser.add_argument("--noise", nargs="+", default=["prng"], choices=["prng", "table"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(RESULTS, "unroll.json"))
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give at least 1")
    if any(u < 1 for u in args.unroll):
        parser.error(f"--unroll {' '.join(map(str, args.unroll))}: every value must be at least 1")
    dims = [int(d) for d in args.dims]
    if any(d < 1 for d in dims):
        parser.error(f"--dims {' '.join(map(str, args.dims))}: every value must be at least 1")
    cells = [(s, n, d) for s in args.strategies for n in args.noise for d in dims]
    runs = {(cell, u): [] for cell in cells for u in args.unroll}
    for round_ in range(args.rounds):
        for cell in cells:
            order = args.unroll if round_ % 2 == 0 else args.unroll[::-1]
            for unroll in order:
                result = child(*cell, unroll)
                if "error" in result:
                    raise SystemExit(f"{cell} UNROLL={unroll}: {result['error']}")
                runs[(cell, unroll)].append(result)
                print(f"round {round_} {cell} UNROLL={unroll}: compile {result['compile_s']:.2f} s, "
                      f"{result['generation_s']:.4f} CPU s/generation", flush=True)
    medians = {key: {k: statistics.median(r[k] for r in results) for k in ("compile_s", "generation_s")}
               for key, results in runs.items()}
    base = args.unroll[0]
    rows = []
    for cell in cells:
        for unroll in args.unroll:
            m, b = medians[(cell, unroll)], medians[(cell, base)]
            rows.append([*cell[:2], f"{cell[2]:.0e}", unroll, f"{m['generation_s']:.4f}",
                         f"{m['generation_s'] / b['generation_s']:.2f}", f"{m['compile_s']:.2f}",
                         f"{m['compile_s'] / b['compile_s']:.2f}"])
    header = ["strategy", "noise", "params", "UNROLL", "CPU s / generation", f"/ UNROLL={base}",
              "compile CPU s", f"/ UNROLL={base}"]
    write_results(args.out, [{"strategy": c[0], "noise": c[1], "dim": c[2], "unroll": u, "rounds": runs[(c, u)],
                              "median": medians[(c, u)]} for c in cells for u in args.unroll],
                  markdown_table(header, rows),
                  {"rounds": args.rounds, "popsize": POPSIZE, "generations_per_call": GENERATIONS})


if __name__ == "__main__":
    main()
