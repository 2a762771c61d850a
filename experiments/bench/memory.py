"""Peak memory of one generation against popsize, for every strategy, each run in its own process.

    python -m experiments.bench.memory                     # every row of ROWS, 1e6 params, popsize 256 / 1,024 / 4,096
    python -m experiments.bench.memory --rows OpenES SNES --popsizes 256 1024 --params 100000
    python -m experiments.bench.memory --rows OpenES+LowRank   # rank-1 noise on one sqrt(params)^2 matrix

The engine rebuilds perturbations in bounded batches, so peak RSS should not
grow with popsize (target: under 3 GiB at 1e6 params for all three sizes,
for every row). A materialising implementation needs about 16 bytes x
popsize x params.

A row is a name and a function ``popsize -> strategy`` in ``ROWS``; add one
there (another noise source, another strategy) and it gets measured like the
others.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable

import es
from experiments.bench.common import machine_description, markdown_table, peak_rss_bytes, run_child

TARGET_GIB = 3.0
SIGMA = 0.01

ROWS: dict[str, Callable[[int], es.Strategy]] = {
    "OpenES": lambda popsize: es.OpenES(popsize=popsize, sigma=SIGMA),
    "SNES": lambda popsize: es.SNES(popsize=popsize, sigma=SIGMA),
    "PGPE": lambda popsize: es.PGPE(popsize=popsize, sigma=SIGMA),
    "ARS": lambda popsize: es.ARS(popsize=popsize, sigma=SIGMA),
    "SepCMAES": lambda popsize: es.SepCMAES(popsize=popsize, sigma=SIGMA),
    "OpenES+LowRank": lambda popsize: es.OpenES(popsize=popsize, sigma=SIGMA, noise=es.LowRankNoise()),
}
"""The measured configurations: name -> ``popsize -> strategy`` (each with its defaults but ``sigma``)."""


def child(row: str, popsize: int, num_params: int, generations: int) -> dict:
    import jax
    import jax.numpy as jnp

    def sphere(x, key):
        return -jnp.sum(x * x)

    baseline = peak_rss_bytes()
    strategy = ROWS[row](popsize)
    params = jnp.ones(num_params)
    if isinstance(strategy.noise, es.LowRankNoise):  # a square matrix, perturbed by low-rank products
        side = round(num_params**0.5)
        params = jnp.ones((side, side))
    state = strategy.init(jax.random.key(0), params)
    start = time.perf_counter()
    state, metrics = es.evolve(strategy, sphere, state, generations)
    jax.block_until_ready(state)
    seconds = time.perf_counter() - start
    return {
        "row": row,
        "popsize": popsize,
        "params": int(params.size),
        "generations": generations,
        "seconds_incl_compile": seconds,
        "rss_before_bytes": baseline,
        "peak_rss_bytes": peak_rss_bytes(),
        "finite": bool(jnp.all(jnp.isfinite(state.params))),
    }


def table(results: dict[str, dict[int, dict]], popsizes: list[int], num_params: int) -> str:
    """One line per row: peak RSS (GiB) at each popsize, the spread, and the target."""
    rows = []
    for row, by_popsize in results.items():
        peaks = [by_popsize[p].get("peak_rss_bytes") for p in popsizes]
        cells = [f"{b / 2**30:.2f}" if b else by_popsize[p].get("error", "-")[:60] for b, p in zip(peaks, popsizes)]
        measured = [b / 2**30 for b in peaks if b]
        ok = (len(measured) == len(popsizes) and max(measured) < TARGET_GIB
              and all(by_popsize[p].get("finite") for p in popsizes))
        spread = f"{max(measured) - min(measured):.2f}" if measured else "-"
        rows.append([row, *cells, spread, "yes" if ok else "NO"])
    rows.append(["(16 B x popsize x params)", *(f"{16 * p * num_params / 2**30:.1f}" for p in popsizes), "", ""])
    header = ["strategy", *(f"popsize {p:,} (GiB)" for p in popsizes), "max - min", f"all < {TARGET_GIB:g} GiB"]
    return markdown_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=int, default=1_000_000)
    parser.add_argument("--popsizes", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--generations", type=int, default=1)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--popsize", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.rows[0], args.popsize, args.params, args.generations)))
        return

    print(f"# peak RSS of es.evolve, {args.params:,d} params, {args.generations} generation(s), sigma {SIGMA}")
    print(f"# machine: {machine_description()}")
    results: dict[str, dict[int, dict]] = {}
    for row in args.rows:
        results[row] = {}
        for popsize in args.popsizes:
            result = run_child("experiments.bench.memory", [
                "--child", "--rows", row, "--popsize", str(popsize), "--params", str(args.params),
                "--generations", str(args.generations)])
            results[row][popsize] = result
            print(json.dumps({"row": row, "popsize": popsize, **result}), flush=True)
    print()
    print(table(results, args.popsizes, args.params))


if __name__ == "__main__":
    main()
