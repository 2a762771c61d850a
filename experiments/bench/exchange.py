"""exchange="fitness" against exchange="gradient": seconds per generation and bytes moved.

    python -m experiments.bench.exchange                    # 2 and 8 emulated CPU devices, a grid of params x popsize
    python -m experiments.bench.exchange --devices 8 --params 1000 100000 --popsizes 64 1024

For every mesh size one child process is started with that many emulated CPU
devices; for each (params, popsize) it compiles both modes, times them in
alternation (medians) and reads the bytes each moves per generation from the
compiled HLO (``es.collectives_report``). Fitness is the sphere, so the
measurement isolates the engine: noise rebuilt for evaluation, the exchange,
and the noise rebuilt for the gradient.

Per device and generation (``n`` devices, ``t`` seconds to rebuild one noise
float, antithetic pairs)::

    "fitness":   rebuilds P/2 vectors for the update on every device   -> moves 4P bytes
    "gradient":  rebuilds P/(2n) of them, then all-reduces D floats     -> moves 4P + 4D bytes

so "gradient" saves ``(P/2)(1 - 1/n) D t`` seconds of compute and pays one
all-reduce of ``4D`` bytes; see docs/benchmarks.md for the crossover.
"""

from __future__ import annotations

import argparse
import json
import os

from experiments.bench.common import machine_description, markdown_table, median, run_child, timed, write_results


def child(num_devices: int, dims: list[int], popsizes: list[int], rounds: int, work: float) -> dict:
    import jax
    import jax.numpy as jnp

    import es

    assert jax.device_count() == num_devices, jax.devices()
    mesh = es.make_mesh(num_devices)

    def sphere(x, key):
        del key
        return -jnp.sum(x * x)

    rows = []
    for dim in dims:
        for popsize in popsizes:
            if popsize % num_devices:
                continue
            generations = int(min(100, max(1, round(work / (dim * popsize)))))
            row = {"params": dim, "popsize": popsize, "devices": num_devices, "generations": generations}
            calls = {}
            for exchange in ("fitness", "gradient"):
                strategy = es.OpenES(popsize=popsize, sigma=0.01)
                state = strategy.init(jax.random.key(0), jnp.ones(dim))
                run = jax.jit(lambda s, strategy=strategy, exchange=exchange: es.evolve(
                    strategy, sphere, s, generations, mesh=mesh, exchange=exchange))
                compiled = run.lower(state).compile()
                jax.block_until_ready(compiled(state))
                calls[exchange] = (compiled, state)
                row[f"{exchange}_bytes"] = es.collectives_report(
                    strategy, sphere, state, mesh, exchange=exchange).total_bytes
                row[f"{exchange}_s"] = []
            for _ in range(rounds):
                for exchange, (compiled, state) in calls.items():
                    row[f"{exchange}_s"] += timed(lambda: jax.block_until_ready(compiled(state)), 1)
            for exchange in calls:
                row[f"{exchange}_s_per_gen"] = median(row[f"{exchange}_s"]) / generations
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--params", type=int, nargs="+", default=[100, 1_000, 10_000, 100_000])
    parser.add_argument("--popsizes", type=int, nargs="+", default=[16, 256, 1024])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=float, default=2e8, help="member·params per timed call")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "exchange.json"))
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.params, args.popsizes, args.rounds, args.work)))
        return

    print(f"# exchange modes on emulated CPU devices; machine: {machine_description()}", flush=True)
    rows = []
    for num_devices in args.devices:
        result = run_child(
            "experiments.bench.exchange",
            ["--child", str(num_devices), "--params", *map(str, args.params), "--popsizes", *map(str, args.popsizes),
             "--rounds", str(args.rounds), "--work", str(args.work)],
            env={"XLA_FLAGS": f"--xla_force_host_platform_device_count={num_devices}"},
        )
        if "error" in result:
            print(f"{num_devices} devices: {result['error']}")
            continue
        rows += result["rows"]
    table = markdown_table(
        ["devices", "params", "popsize", '"fitness" s/gen', '"gradient" s/gen', "fitness / gradient time",
         '"fitness" B/gen', '"gradient" B/gen', "winner"],
        [[r["devices"], f"{r['params']:,}", r["popsize"], f"{r['fitness_s_per_gen']:.4g}", f"{r['gradient_s_per_gen']:.4g}",
          f"{r['fitness_s_per_gen'] / r['gradient_s_per_gen']:.2f}", f"{r['fitness_bytes']:,}", f"{r['gradient_bytes']:,}",
          "fitness" if r["fitness_s_per_gen"] < r["gradient_s_per_gen"] else "gradient"] for r in rows],
    )
    write_results(args.out, rows, table)


if __name__ == "__main__":
    main()
