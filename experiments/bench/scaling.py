"""CPU time and wall time per generation on 1, 2, 4 and 8 emulated devices, per exchange mode and noise source.

    python -m experiments.bench.scaling                          # both problems, all modes, 1/2/4/8 devices
    python -m experiments.bench.scaling --problems update --devices 1 8 --sources prng

Each device count runs in its own child process (XLA_FLAGS sets the number of
emulated CPU devices before JAX starts). In it, every (problem, noise source,
exchange mode) is compiled for ``G1`` and ``G2`` generations per call; the
per-generation cost is ``(t(G2) - t(G1)) / (G2 - G1)`` over medians of
``--repeats`` calls, so what a call pays once (building the noise table,
placing the state) drops out. ``t`` is ``time.process_time()`` (CPU seconds
of every thread of the process) and ``time.perf_counter()`` (wall).

The emulated devices share this machine's cores, so the total work is what
adding devices costs: the redundant-work factor ``CPU(n) / CPU(1)`` is 1 when
the devices split the work and ``n`` when each of them repeats all of it.
Target: <= 1.3 at 8 devices for ``exchange="sharded"``. Where a generation is
cheap (the noise table), time more of them per call, e.g. ``--generations 2 10
--repeats 5``: a difference of two short calls doubles their noise.

``--one-core`` runs every child on one core (``os.sched_setaffinity``), so 1
and 8 devices get the same hardware: 8 emulated devices then take turns on
that core instead of 8 threads contending for 2 cores' caches and memory
bandwidth with XLA's intra-op threads, which real devices would not do.
``--rounds R`` runs the device counts R times in turn (1, 8, 1, 8, ...) and
reports each cell's median over the rounds: the machines are shared, and
a cheap generation's CPU time varies by 20-40% from one child to the next.

Problems:
  update: 1e6 params (``--params``), popsize 256, a sphere (cheap fitness):
    the update's noise dominates.
  eval: Pendulum-v1 with the tasks' MLP policy (64x64, 4.5k params),
    popsize 256, one 200-step episode per member: the rollouts dominate.
    (Pendulum rather than CartPole: its episodes always last 200 steps,
    while an untrained CartPole policy falls within a few steps and the
    generation costs almost nothing.)
"""

from __future__ import annotations

import argparse
import json
import os
import time

from experiments.bench.common import machine_description, markdown_table, median, run_child, write_results

MODES = ("fitness", "sharded", "gradient")
SOURCES = ("prng", "table")
PROBLEMS = ("update", "eval")
TARGET = 1.3


def _noise(source: str, dim: int):
    import es

    return es.GaussianNoise() if source == "prng" else es.NoiseTable(size=max(2**20, 16 * dim), seed=0)


def _problem(name: str, num_params: int):
    """``(fitness_fn, params, generations per call (G1, G2))`` of a problem."""
    import jax
    import jax.numpy as jnp

    if name == "update":
        def sphere(x, key):
            del key
            return -jnp.sum(x * x)

        return sphere, jnp.full((num_params,), 0.5, jnp.float32), (1, 3)
    import tasks

    task = tasks.make("Pendulum-v1", obs_norm=False)
    return task.fitness, task.init_params(jax.random.key(0)), (2, 6)


def _cost(fn, repeats: int) -> tuple[float, float]:
    """Median (CPU seconds, wall seconds) of ``repeats`` calls of ``fn``."""
    cpu, wall = [], []
    for _ in range(repeats):
        c, w = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return median(cpu), median(wall)


def child(num_devices: int, problems: list[str], sources: list[str], modes: list[str], popsize: int,
          num_params: int, repeats: int, generations: tuple[int, int] | None = None, one_core: bool = False) -> dict:
    if one_core:  # before JAX starts its threads, which inherit the affinity
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import jax

    import es

    assert jax.device_count() == num_devices, jax.devices()
    mesh = es.make_mesh(num_devices)
    rows = []
    for problem in problems:
        fitness_fn, params, (g1, g2) = _problem(problem, num_params)
        g1, g2 = generations or (g1, g2)
        dim = es.engine.num_params(params)
        for source in sources:
            # Adam built by name is coordinatewise: "sharded" then updates each device's slice (es/engine/update.py)
            strategy = es.OpenES(popsize=popsize, sigma=0.05, optimizer=es.optimizers.make("adam", learning_rate=0.01),
                                 noise=_noise(source, dim))
            state = strategy.init(jax.random.key(0), params)
            for mode in modes:
                costs = {}
                for generations in (g1, g2):
                    run = jax.jit(lambda s, g=generations, m=mode: es.evolve(
                        strategy, fitness_fn, s, g, mesh=mesh, exchange=m))
                    compiled = run.lower(state).compile()
                    jax.block_until_ready(compiled(state))  # warm up
                    costs[generations] = _cost(lambda c=compiled: jax.block_until_ready(c(state)), repeats)
                cpu = (costs[g2][0] - costs[g1][0]) / (g2 - g1)
                wall = (costs[g2][1] - costs[g1][1]) / (g2 - g1)
                report = es.exchange_report(strategy, fitness_fn, state, mesh, measure=False)
                model = next(c for c in report.costs if c.mode == mode)
                row = {"problem": problem, "params": dim, "popsize": popsize, "source": source, "mode": mode,
                       "devices": num_devices, "generations": [g1, g2], "repeats": repeats,
                       "cores": len(os.sched_getaffinity(0)),
                       "cpu_s_per_gen": cpu, "wall_s_per_gen": wall,
                       "bytes_per_gen": model.bytes, "update_floats_per_device": model.update_floats,
                       "coordinates_updated_per_device": report.update_coordinates if mode == "sharded" else dim,
                       "eval_floats_per_device": model.eval_floats}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return {"rows": rows}


def table(rows: list[dict]) -> str:
    """One line per (problem, source, mode): CPU and wall seconds per generation at each device count."""
    devices = sorted({r["devices"] for r in rows})
    keys = sorted({(r["problem"], r["source"], r["mode"]) for r in rows},
                  key=lambda k: (PROBLEMS.index(k[0]), SOURCES.index(k[1]), MODES.index(k[2])))
    by = {(r["problem"], r["source"], r["mode"], r["devices"]): r for r in rows}
    body = []
    for problem, source, mode in keys:
        base = by.get((problem, source, mode, 1)) or by.get((problem, source, "fitness", 1))
        cells = []
        for n in devices:
            r = by.get((problem, source, mode, n))
            if r is None:
                cells.append("-")
                continue
            factor = f" ({r['cpu_s_per_gen'] / base['cpu_s_per_gen']:.2f}x)" if base else ""
            cells.append(f"{r['cpu_s_per_gen']:.3g} / {r['wall_s_per_gen']:.3g}{factor}")
        last = by.get((problem, source, mode, devices[-1]))
        body.append([problem, source, mode, *cells, f"{last['bytes_per_gen']:,}" if last else "-"])
    header = ["problem", "noise", "exchange", *[f"{n} dev: CPU / wall s (CPU(n)/CPU(1))" for n in devices],
              f"bytes/gen at {devices[-1]} dev"]
    return markdown_table(header, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--problems", nargs="+", choices=PROBLEMS, default=list(PROBLEMS))
    parser.add_argument("--sources", nargs="+", choices=SOURCES, default=list(SOURCES))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--popsize", type=int, default=256)
    parser.add_argument("--params", type=int, default=1_000_000, help="params of the update-bound problem")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--generations", type=int, nargs=2, metavar=("G1", "G2"),
                        help="generations per call (default: 1 3 for update, 2 6 for eval); more for cheap generations")
    parser.add_argument("--one-core", action="store_true", help="run every child on one core (see above)")
    parser.add_argument("--rounds", type=int, default=1, help="run the device counts this many times in turn")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "scaling.json"))
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.problems, args.sources, args.modes, args.popsize, args.params,
                               args.repeats, tuple(args.generations) if args.generations else None,
                               args.one_core)))
        return

    cores = "one core per child" if args.one_core else f"{len(os.sched_getaffinity(0))} cores"
    print(f"# scaling over emulated CPU devices ({cores}); machine: {machine_description()}", flush=True)
    rounds = []
    for round_index in range(args.rounds):
        for num_devices in args.devices:
            result = run_child(
                "experiments.bench.scaling",
                ["--child", str(num_devices), "--problems", *args.problems, "--sources", *args.sources,
                 "--modes", *args.modes, "--popsize", str(args.popsize), "--params", str(args.params),
                 "--repeats", str(args.repeats), *(["--one-core"] if args.one_core else []),
                 *(["--generations", *map(str, args.generations)] if args.generations else [])],
                timeout=7200,
                env={"XLA_FLAGS": f"--xla_force_host_platform_device_count={num_devices}"},
            )
            if "error" in result:
                print(f"{num_devices} devices: {result['error']}", flush=True)
                continue
            rounds += [{**row, "round": round_index} for row in result["rows"]]
            print(f"# round {round_index + 1}/{args.rounds}: {num_devices} device(s) done", flush=True)
    rows = median_over_rounds(rounds)
    text = table(rows)
    write_results(args.out, rows, text, extra={"rounds": rounds} if args.rounds > 1 else None)


def median_over_rounds(rows: list[dict]) -> list[dict]:
    """One row per (problem, source, mode, devices): the median CPU and wall seconds over its rounds."""
    cells: dict[tuple, list[dict]] = {}
    for row in rows:
        cells.setdefault((row["problem"], row["source"], row["mode"], row["devices"]), []).append(row)
    merged = []
    for runs in cells.values():
        merged.append({**{k: v for k, v in runs[0].items() if k != "round"}, "rounds": len(runs),
                       "cpu_s_per_gen": median([r["cpu_s_per_gen"] for r in runs]),
                       "wall_s_per_gen": median([r["wall_s_per_gen"] for r in runs]),
                       "cpu_s_per_gen_rounds": [r["cpu_s_per_gen"] for r in runs]})
    return merged


if __name__ == "__main__":
    main()
