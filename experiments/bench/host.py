"""es.HostFitness throughput with 1 and 2 workers, and its overhead against a plain multiprocessing.Pool loop.

    flock /tmp/es-heavy.lock python -m experiments.bench.host
    python -m experiments.bench.host --popsize 32 --work-ms 1 20 --workers 1 2

The fitness is a numpy function of fixed cost (``--work-ms`` milliseconds of
small matrix products per member, calibrated once on this machine). For each
cost and worker count the script times

- ``es.evolve(strategy, es.HostFitness(fn, num_workers=w), state, G)``: whole
  generations (members built by JAX, one host callback, the pool, the ES
  update), median seconds per generation over ``--repeats`` calls of ``G``
  generations after a compiling call;
- a plain ``multiprocessing.Pool(w)`` (forkserver, as HostFitness) evaluating
  members of the same problem with ``pool.starmap``, one call per generation,
  members built beforehand by ``es.ask`` (so only evaluation and transfers are
  timed), alternating with the ``es.evolve`` calls.

The overhead per generation is the difference of the two medians; the table
also gives members evaluated per second, and the ideal time per generation
(popsize x one member's measured time / workers: perfect parallelism, no
transfers), which shows how many cores the machine really gave the run. Side-by-side in one process, so both
see the same machine load.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time

import numpy as np

from experiments.bench.common import machine_description, markdown_table, median, timed

SIZE = 48  # the side of the matrices of the synthetic work


def work(params, seed, rounds):
    """A member's fitness after ``rounds`` fixed matrix products (deterministic numpy work)."""
    x = np.asarray(params["x"], np.float64)
    m = np.resize(x, (SIZE, SIZE)) / (1.0 + np.abs(x).sum())
    v = np.ones(SIZE)
    for _ in range(rounds):
        v = np.tanh(m @ v + 0.01 * (seed % 7))
    return -float(np.sum(x**2)) + 1e-9 * float(v.sum())


def rounds_for(milliseconds: float, per_round: float) -> int:
    """How many rounds of ``work`` take ``milliseconds`` at ``per_round`` seconds each."""
    return max(1, round(milliseconds / 1000 / per_round))


def seconds_per_round(rounds: int = 2000, repeats: int = 7) -> float:
    """The median time of one round of ``work`` on one core here (after a warm-up call)."""
    params = {"x": np.linspace(-1, 1, 100)}
    work(params, 0, rounds)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work(params, 0, rounds)
        times.append((time.perf_counter() - start) / rounds)
    return median(times)


def bench(popsize: int, dim: int, rounds: int, workers: int, generations: int, repeats: int) -> dict:
    import functools

    import jax
    import jax.numpy as jnp

    import es

    fn = functools.partial(work, rounds=rounds)
    strategy = es.OpenES(popsize=popsize, sigma=0.1)
    state = strategy.init(jax.random.key(0), {"x": jnp.linspace(-1.0, 1.0, dim)})
    members = jax.tree.map(np.asarray, es.ask(strategy, state))
    arguments = [({"x": members["x"][i]}, i) for i in range(popsize)]
    host, plain = [], []
    with es.HostFitness(fn, num_workers=workers) as fitness, \
            multiprocessing.get_context("forkserver").Pool(workers) as pool:
        state, _ = es.evolve(strategy, fitness, state, generations)  # compiles, starts the workers
        pool.starmap(fn, arguments)  # starts the workers
        for _ in range(repeats):  # alternated, so that both see the same machine load
            start = time.perf_counter()
            state, _ = es.evolve(strategy, fitness, state, generations)
            host.append((time.perf_counter() - start) / generations)
            start = time.perf_counter()
            for _ in range(generations):
                pool.starmap(fn, arguments)
            plain.append((time.perf_counter() - start) / generations)
    host_s, plain_s = median(host), median(plain)
    return {
        "workers": workers,
        "host_fitness_s_per_generation": host_s,
        "pool_s_per_generation": plain_s,
        "overhead_ms_per_generation": 1000 * (host_s - plain_s),
        "host_fitness_members_per_s": popsize / host_s,
        "pool_members_per_s": popsize / plain_s,
        "ideal_s_per_generation": popsize * median(timed(lambda: fn(*arguments[0]), 5)) / workers,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--popsize", type=int, default=32)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--work-ms", type=float, nargs="+", default=[1.0, 20.0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--generations", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    rows, results = [], []
    per_round = seconds_per_round()  # calibrated once, so the costs keep their ratio
    for milliseconds in args.work_ms:
        rounds = rounds_for(milliseconds, per_round)
        for workers in args.workers:
            result = {"work_ms": milliseconds, "rounds": rounds,
                      **bench(args.popsize, args.dim, rounds, workers, args.generations, args.repeats)}
            results.append(result)
            print(json.dumps(result), flush=True)
            rows.append([
                f"{milliseconds:g} ms", str(workers), f"{1000 * result['ideal_s_per_generation']:.1f}",
                f"{1000 * result['host_fitness_s_per_generation']:.1f}",
                f"{1000 * result['pool_s_per_generation']:.1f}",
                f"{result['overhead_ms_per_generation']:+.1f}",
                f"{result['host_fitness_members_per_s']:.0f}", f"{result['pool_members_per_s']:.0f}",
            ])
    print(machine_description())
    print(f"popsize {args.popsize}, {args.dim} params, medians of {args.repeats} x {args.generations} generations")
    print(markdown_table(
        ["work per member", "workers", "ideal ms/gen", "HostFitness ms/gen", "Pool ms/gen", "overhead ms/gen",
         "HostFitness members/s", "Pool members/s"], rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
