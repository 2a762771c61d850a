"""Multi-process ES on this machine's CPUs: throughput, and the bytes that cross processes.

    python -m experiments.bench.distributed                 # both parts, defaults below
    python -m experiments.bench.distributed --part throughput --repeats 7
    python -m experiments.bench.distributed --part bytes

1. Throughput. The same run (a small MLP policy rollout, 10,000-D
   Rastrigin, and a tiny 8-D sphere that shows the per-generation cost of the
   exchange itself) on the same number of cores, with and without a process
   boundary: 1 process x 1 device (1 core), 1 process x 2 devices (2 cores),
   2 processes x 1 device (1 core each). Every configuration runs under
   ``python -m es.launch --cpus-per-process K``, which pins each process to
   its own cores (CPU affinity and ``NPROC``), and with
   ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false`` so every device computes
   on one thread: 2 devices use 2 cores whether they live in one process or
   two. Generations per second are medians of ``--repeats`` timed calls
   (after a compile call), the configurations interleaved round by round.

2. Bytes per generation crossing processes, from ``es.collectives_report``
   on a mesh of 2 processes x 1 device, against popsize (at 10,000 params)
   and against params (at popsize 256), for the default ``exchange="fitness"``
   and, for contrast, ``exchange="gradient"``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

from experiments.bench.common import machine_description, markdown_table, median, run_command

CONFIGS = (  # (label, processes, devices per process, cores per process)
    ("1 process x 1 device", 1, 1, 1),
    ("1 process x 2 devices", 1, 2, 2),
    ("2 processes x 1 device", 2, 1, 1),
)
WORKLOADS = {  # name -> generations per timed call
    "policy": 20,  # 100-step MLP rollouts: the fitness dominates
    "rastrigin": 20,  # 10,000-D, cheap fitness: rebuilding the noise for the update dominates
    "tiny": 500,  # 8-D sphere, popsize 16: almost no work, so the per-generation exchange shows
}
POPSIZES = (64, 256, 1024, 4096)
PARAM_SIZES = (1_000, 10_000, 100_000, 1_000_000)
_LAYOUT = re.compile(r"\{[0-9,]*\}")  # HLO layouts such as {0}


# --------------------------------------------------------------------------- children (run under es.launch)


def make_workload(name: str, popsize: int):
    import jax
    import jax.numpy as jnp
    import optax

    import es

    if name == "tiny":
        def fitness(x, key):
            del key
            return -jnp.sum(x * x)

        return es.OpenES(popsize=16, sigma=0.1), fitness, jnp.ones(8)
    if name == "rastrigin":
        def fitness(x, key):
            del key
            return -(10.0 * x.size + jnp.sum(x**2 - 10.0 * jnp.cos(2 * jnp.pi * x)))

        params = jnp.full((10_000,), 2.0)
    else:  # a 100-step rollout of a 16 -> 64 -> 4 tanh MLP in a noisy linear system (~1.3k params)
        def fitness(params, key):
            def step(carry, step_key):
                obs, total = carry
                action = jnp.tanh(jnp.tanh(obs @ params["w1"] + params["b1"]) @ params["w2"])
                obs = 0.95 * obs + 0.1 * jnp.tile(action, 4) + 0.05 * jax.random.normal(step_key, obs.shape)
                return (obs, total - jnp.sum(obs**2)), None

            (_, total), _ = jax.lax.scan(step, (jnp.ones(16), 0.0), jax.random.split(key, 100))
            return total

        k1, k2 = jax.random.split(jax.random.key(1))
        params = {"w1": 0.1 * jax.random.normal(k1, (16, 64)), "b1": jnp.zeros(64),
                  "w2": 0.1 * jax.random.normal(k2, (64, 4))}
    strategy = es.OpenES(popsize=popsize, sigma=0.05, optimizer=optax.adam(1e-2))
    return strategy, fitness, params


def child_throughput(workload: str, popsize: int, generations: int, repeats: int) -> dict:
    import es

    group = es.distributed.initialize()
    import jax

    strategy, fitness, params = make_workload(workload, popsize)
    state = strategy.init(jax.random.key(0), params)
    mesh = es.make_mesh()
    start = time.perf_counter()
    state, _ = es.evolve(strategy, fitness, state, generations, mesh=mesh)
    jax.block_until_ready(state)
    compile_seconds = time.perf_counter() - start
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        state, metrics = es.evolve(strategy, fitness, state, generations, mesh=mesh)
        jax.block_until_ready((state, metrics))
        seconds.append(time.perf_counter() - start)
    return {
        "workload": workload,
        "popsize": strategy.popsize,
        "generations": generations,
        "processes": group.num_processes,
        "devices": mesh.size,
        "affinity": sorted(os.sched_getaffinity(0)),
        "first_call_seconds": compile_seconds,
        "seconds": seconds,
        "last_fitness_mean": float(es.distributed.fetch(metrics)["fitness_mean"][-1]),
    }


def child_bytes() -> dict:
    import es

    group = es.distributed.initialize()
    import jax
    import jax.numpy as jnp

    def sphere(x, key):
        del key
        return -jnp.sum(x * x)

    mesh = es.make_mesh()
    rows = []

    def measure(popsize, dim, exchange):
        strategy = es.OpenES(popsize=popsize, sigma=0.05)
        state = strategy.init(jax.random.key(0), jnp.zeros(dim))
        report = es.collectives_report(strategy, sphere, state, mesh, exchange=exchange)
        rows.append({
            "popsize": popsize, "params": dim, "exchange": exchange, "total_bytes": report.total_bytes,
            "collectives": [f"{c.op} {_LAYOUT.sub('', c.result)} over {c.group_size} devices"
                            for c in report.crossing],
        })

    for popsize in POPSIZES:
        measure(popsize, 10_000, "fitness")
    for dim in PARAM_SIZES:
        measure(256, dim, "fitness")
    for dim in PARAM_SIZES:
        measure(256, dim, "gradient")
    return {"processes": group.num_processes, "mesh_devices": mesh.size,
            "mesh_processes": sorted({d.process_index for d in mesh.devices.flat}), "rows": rows}


# --------------------------------------------------------------------------- parent


def launch(processes: int, devices: int, cpus: int, child_args: list[str], timeout: float) -> dict:
    """Run this module's child under es.launch; return rank 0's JSON result."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_cpu_multi_thread_eigen" not in f]
    env["XLA_FLAGS"] = " ".join(flags + ["--xla_cpu_multi_thread_eigen=false"])
    command = [
        sys.executable, "-m", "es.launch", "--processes", str(processes), "--devices-per-process", str(devices),
        "--cpus-per-process", str(cpus), "--timeout", str(timeout), "--",
        sys.executable, "-m", "experiments.bench.distributed", "--child", *child_args,
    ]
    return run_command(command, timeout + 60, env=env, prefix="[rank 0] ")


def throughput(args) -> None:
    print(f"## Throughput: generations/s, median of {args.repeats} calls per run, popsize {args.popsize} "
          f"(tiny: 16), {args.rounds} round(s) interleaved")
    results = {(w, c[0]): [] for w in WORKLOADS for c in CONFIGS}
    for _ in range(args.rounds):
        for workload, default_generations in WORKLOADS.items():
            generations = args.generations or default_generations
            for label, processes, devices, cpus in CONFIGS:
                child = ["throughput", "--workload", workload, "--popsize", str(args.popsize),
                         "--generations", str(generations), "--repeats", str(args.repeats)]
                result = launch(processes, devices, cpus, child, args.timeout)
                print(json.dumps({"config": label, **result}), flush=True)
                if "error" not in result:
                    results[(workload, label)] += [generations / s for s in result["seconds"]]
    rows = []
    for workload in WORKLOADS:
        base = results[(workload, CONFIGS[0][0])]
        two_devices = results[(workload, CONFIGS[1][0])]
        for label, processes, devices, cpus in CONFIGS:
            rates = results[(workload, label)]
            if not rates:
                rows.append([workload, label, processes * cpus, "-", "-", "-", "-", "-"])
                continue
            rate = median(rates)
            spread = f"{min(rates):.1f}-{max(rates):.1f}"
            vs_one = f"{rate / median(base):.2f}" if base else "-"
            vs_two = f"{rate / median(two_devices):.2f}" if two_devices else "-"
            rows.append([workload, label, processes * cpus, f"{rate:.1f}", f"{1e3 / rate:.3f}", spread, vs_one,
                         vs_two])
    print()
    print(markdown_table(
        ["workload", "configuration", "cores", "gens/s (median)", "ms/gen", "min-max gens/s", "vs 1x1",
         "vs 1 process x 2 devices"],
        rows,
    ))


def bytes_per_generation(args) -> None:
    print("## Bytes per generation crossing devices and processes (es.collectives_report, 2 processes x 1 device)")
    result = launch(2, 1, 1, ["bytes"], args.timeout)
    print(json.dumps(result), flush=True)
    if "error" in result:
        return
    print()
    rows = [[r["popsize"], f"{r['params']:,d}", r["exchange"], f"{r['total_bytes']:,d}",
             f"{r['total_bytes'] / r['popsize']:.1f}", "; ".join(r["collectives"])] for r in result["rows"]]
    print(markdown_table(["popsize", "params", "exchange", "bytes/generation", "bytes per member", "collectives"],
                         rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("throughput", "bytes", "all"), default="all")
    parser.add_argument("--popsize", type=int, default=256)
    parser.add_argument("--generations", type=int, default=None,
                        help="generations per timed call (default: 20, tiny 500)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per run")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every configuration, interleaved")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per launched run")
    parser.add_argument("--child", choices=("throughput", "bytes"), help=argparse.SUPPRESS)
    parser.add_argument("--workload", choices=tuple(WORKLOADS), default="policy", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "throughput":
        result = child_throughput(args.workload, args.popsize, args.generations, args.repeats)
        print(json.dumps(result), flush=True)
        return
    if args.child == "bytes":
        print(json.dumps(child_bytes()), flush=True)
        return
    print(f"# es multi-process benchmark; machine: {machine_description()}")
    print(f"# load average before: {os.getloadavg()}")
    if args.part in ("throughput", "all"):
        throughput(args)
        print()
    if args.part in ("bytes", "all"):
        bytes_per_generation(args)
    print(f"# load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
