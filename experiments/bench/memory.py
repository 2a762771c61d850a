"""Peak memory of one OpenAI-ES generation against popsize, each size in its own process.

    python -m experiments.bench.memory                     # 1e6 params, popsize 256 / 1,024 / 4,096
    python -m experiments.bench.memory --popsizes 256 1024 --params 100000
    python -m experiments.bench.memory --noise lowrank     # es.LowRankNoise(rank=1): one sqrt(params)^2 matrix

The engine rebuilds perturbations in bounded batches, so peak RSS should not
grow with popsize (target: under 3 GiB at 1e6 params for all three sizes).
A materialising implementation needs about 16 bytes x popsize x params.
"""

from __future__ import annotations

import argparse
import json
import time

from experiments.bench.common import machine_description, markdown_table, peak_rss_bytes, run_child

TARGET_GIB = 3.0


def child(popsize: int, num_params: int, generations: int, noise: str = "prng") -> dict:
    import jax
    import jax.numpy as jnp

    import es

    def sphere(x, key):
        return -jnp.sum(x * x)

    baseline = peak_rss_bytes()
    params = jnp.ones(num_params)
    if noise == "lowrank":  # a square matrix, perturbed by rank-1 products
        side = round(num_params**0.5)
        params = jnp.ones((side, side))
    source = es.LowRankNoise() if noise == "lowrank" else es.GaussianNoise()
    strategy = es.OpenES(popsize=popsize, sigma=0.01, noise=source)
    state = strategy.init(jax.random.key(0), params)
    start = time.perf_counter()
    state, metrics = es.evolve(strategy, sphere, state, generations)
    jax.block_until_ready(state)
    seconds = time.perf_counter() - start
    return {
        "popsize": popsize,
        "params": int(params.size),
        "noise": noise,
        "generations": generations,
        "seconds_incl_compile": seconds,
        "rss_before_bytes": baseline,
        "peak_rss_bytes": peak_rss_bytes(),
        "finite": bool(jnp.all(jnp.isfinite(state.params))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=int, default=1_000_000)
    parser.add_argument("--popsizes", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--generations", type=int, default=1)
    parser.add_argument("--noise", choices=["prng", "lowrank"], default="prng")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--popsize", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.popsize, args.params, args.generations, args.noise)))
        return

    print(f"# peak RSS of es.evolve, {args.params:,d} params, {args.noise} noise, {args.generations} generation(s)")
    print(f"# machine: {machine_description()}")
    rows = []
    for popsize in args.popsizes:
        result = run_child(
            "experiments.bench.memory",
            ["--child", "--popsize", str(popsize), "--params", str(args.params), "--generations", str(args.generations),
             "--noise", args.noise],
        )
        if "error" in result:
            rows.append([popsize, "-", "-", "-", result["error"]])
            continue
        peak = result["peak_rss_bytes"] / 2**30
        materialised = 16 * popsize * args.params / 2**30
        rows.append([
            popsize,
            f"{peak:.2f}",
            f"{materialised:.1f}",
            f"{result['seconds_incl_compile']:.1f}",
            "yes" if peak < TARGET_GIB and result["finite"] else "NO",
        ])
        print(json.dumps(result), flush=True)
    print()
    print(markdown_table(
        ["popsize", "peak RSS (GiB)", "16 B x popsize x params (GiB)", "seconds (incl. compile)", f"< {TARGET_GIB} GiB"],
        rows,
    ))


if __name__ == "__main__":
    main()
