"""Low-rank (EGGROLL) perturbations against full-rank ones: seconds per generation, and ES throughput against
pure batch inference.

    python -m experiments.bench.lowrank                      # both parts
    python -m experiments.bench.lowrank --part speed --sizes 1000
    python -m experiments.bench.lowrank --part throughput --popsize 1024

(a) ``speed``: one weight matrix ``[n, n]`` (``n`` = 1000: 1e6 params;
    3163: 1e7), a cheap fitness (``tanh`` of 8 inputs times the matrix),
    OpenES with ``es.GaussianNoise()``, ``es.NoiseTable()``,
    ``es.LowRankNoise(rank=1)`` and ``es.LowRankNoise(rank=1,
    factored=True)``. Seconds per generation are ``(t(G2) - t(G1)) / (G2 -
    G1)`` of compiled ``es.evolve`` calls (medians), so a call's one-off costs
    (the table) drop out. Target: low-rank >= 2x faster than full-rank
    Gaussian noise at 1e6 params.

(b) ``throughput``: the EGGROLL metric. An MLP 512 -> 2048 -> 2048 -> 512
    (6.3M params, tanh), ``--inputs`` inputs per member drawn from the
    member's key, popsize ``--popsize``. ES: one generation of factored
    rank-1 OpenES (evaluation through ``es.matmul``, the update's sums,
    the optimizer step). Pure inference: the same forward passes with the
    unperturbed weights, in the same micro-batches of members (and, for
    reference, in one batch). Throughput is forward passes (member x input)
    per second. Target: ES >= 50% of pure inference.

Each part runs in one child process with a single CPU device.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from experiments.bench.common import machine_description, markdown_table, median, run_child, write_results

NOISES = ("gaussian", "table", "lowrank", "lowrank-factored")
SPEED_TARGET = 2.0
THROUGHPUT_TARGET = 0.5


def _noise(name: str, dim: int):
    import es

    return {
        "gaussian": es.GaussianNoise(),
        "table": es.NoiseTable(size=min(2**31 - 1, 16 * dim), seed=0),
        "lowrank": es.LowRankNoise(rank=1),
        "lowrank-factored": es.LowRankNoise(rank=1, factored=True),
    }[name]


def _per_generation(run, state, g1: int, g2: int, repeats: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per generation: ``(t(g2) - t(g1)) / (g2 - g1)`` of compiled calls, medians of
    ``repeats``. CPU is ``time.process_time()`` (every thread of this process): unlike wall time, it does not
    count what other jobs on a shared machine take."""
    import jax

    times = {}
    for generations in (g1, g2):
        compiled = jax.jit(lambda s, g=generations: run(s, g)).lower(state).compile()
        jax.block_until_ready(compiled(state))
        cpu, wall = [], []
        for _ in range(repeats):
            c, w = time.process_time(), time.perf_counter()
            jax.block_until_ready(compiled(state))
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - w)
        times[generations] = (median(cpu), median(wall))
    return tuple((times[g2][i] - times[g1][i]) / (g2 - g1) for i in range(2))


def speed_child(sizes: list[int], popsizes: list[int], repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    import optax

    import es

    inputs = jnp.linspace(-1.0, 1.0, 8)[:, None]
    rows = []
    for n, popsize in zip(sizes, popsizes):
        x = jnp.tile(inputs, (1, n)) / n**0.5

        def fitness(params, key, x=x):
            del key
            return -jnp.mean(jnp.tanh(es.matmul(x, params["w"])) ** 2)

        params = {"w": jax.random.normal(jax.random.key(0), (n, n)) / n**0.5}
        for noise in NOISES:
            strategy = es.OpenES(popsize=popsize, sigma=0.02, optimizer=optax.adam(1e-3), noise=_noise(noise, n * n))
            state = strategy.init(jax.random.key(1), params)
            cpu, wall = _per_generation(
                lambda s, g, strategy=strategy: es.evolve(strategy, fitness, s, g, mesh=es.make_mesh(1)),
                state, 1, 3, repeats)
            row = {"part": "speed", "params": n * n, "matrix": n, "popsize": popsize, "noise": noise,
                   "cpu_s_per_gen": cpu, "s_per_gen": wall}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"rows": rows}


def throughput_child(popsize: int, inputs: int, widths: list[int], eval_batch_size: int | None,
                     repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    import optax

    import es

    keys = jax.random.split(jax.random.key(0), len(widths) - 1)
    params = {
        f"layer{i}": {"w": jax.random.normal(k, (a, b)) / a**0.5, "b": jnp.zeros(b)}
        for i, (k, a, b) in enumerate(zip(keys, widths[:-1], widths[1:]))
    }
    num_params = es.engine.num_params(params)

    def forward(params, x):
        for i in range(len(widths) - 1):
            x = es.matmul(x, params[f"layer{i}"]["w"]) + params[f"layer{i}"]["b"]
            x = jnp.tanh(x) if i < len(widths) - 2 else x
        return x

    def member_inputs(key):
        return jax.random.normal(key, (inputs, widths[0]))

    def fitness(params, key):
        return -jnp.mean(forward(params, member_inputs(key)) ** 2)

    strategy = es.OpenES(popsize=popsize, sigma=0.02, optimizer=optax.adam(1e-3),
                         noise=es.LowRankNoise(rank=1, factored=True))
    state = strategy.init(jax.random.key(1), params)
    mesh = es.make_mesh(1)
    execution = es.engine.check_evolve_args(strategy, es.fitness.adapter(fitness), state, 1, mesh,
                                            eval_batch_size=eval_batch_size)[1]
    batch = execution.eval_batch_size
    es_cpu, es_seconds = _per_generation(
        lambda s, g: es.evolve(strategy, fitness, s, g, mesh=mesh, eval_batch_size=batch), state, 1, 3, repeats)

    member_keys = jax.random.split(jax.random.key(2), popsize)

    def inference(params, chunks):
        """The same forward passes with the mean's weights: micro-batches of ``chunks.shape[1]`` members."""
        def chunk(keys):
            return jax.vmap(lambda k: -jnp.mean(forward(params, member_inputs(k)) ** 2))(keys)
        return jax.lax.map(chunk, chunks)

    def inference_seconds(chunk_size):
        chunks = member_keys.reshape(popsize // chunk_size, chunk_size, *member_keys.shape[1:])
        compiled = jax.jit(inference).lower(params, chunks).compile()
        jax.block_until_ready(compiled(params, chunks))
        cpu, wall = [], []
        for _ in range(repeats):
            c, w = time.process_time(), time.perf_counter()
            jax.block_until_ready(compiled(params, chunks))
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - w)
        return median(cpu), median(wall)

    (same_cpu, same_batches), (one_cpu, one_batch) = inference_seconds(batch), inference_seconds(popsize)
    passes = popsize * inputs
    row = {
        "part": "throughput", "widths": widths, "params": num_params, "popsize": popsize, "inputs": inputs,
        "eval_batch_size": batch, "es_s_per_gen": es_seconds, "inference_s": same_batches,
        "inference_one_batch_s": one_batch, "es_passes_per_s": passes / es_seconds,
        "inference_passes_per_s": passes / same_batches, "inference_one_batch_passes_per_s": passes / one_batch,
        "ratio": same_batches / es_seconds, "ratio_one_batch": one_batch / es_seconds,
        "es_cpu_s_per_gen": es_cpu, "inference_cpu_s": same_cpu, "inference_one_batch_cpu_s": one_cpu,
        "cpu_ratio": same_cpu / es_cpu, "cpu_ratio_one_batch": one_cpu / es_cpu,
    }
    print(json.dumps(row), flush=True)
    return {"rows": [row]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["speed", "throughput", "both"], default="both")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 3163], help="(a) matrix side n (n*n params)")
    parser.add_argument("--speed-popsizes", type=int, nargs="+", default=[256, 64], help="(a) popsize per size")
    parser.add_argument("--popsize", type=int, default=1024, help="(b) members per generation")
    parser.add_argument("--inputs", type=int, default=16, help="(b) inputs per member")
    parser.add_argument("--widths", type=int, nargs="+", default=[512, 2048, 2048, 512], help="(b) layer widths")
    parser.add_argument("--eval-batch-size", type=int, default=None, help="(b) default: es.evolve's")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "lowrank.json"))
    parser.add_argument("--child", choices=["speed", "throughput"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "speed":
        print(json.dumps(speed_child(args.sizes, args.speed_popsizes, args.repeats)))
        return
    if args.child == "throughput":
        print(json.dumps(throughput_child(args.popsize, args.inputs, args.widths, args.eval_batch_size, args.repeats)))
        return

    print(f"# low-rank perturbations; machine: {machine_description()}", flush=True)
    common = ["--repeats", str(args.repeats)]
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    rows, lines = [], []
    if args.part in ("speed", "both"):
        result = run_child("experiments.bench.lowrank", ["--child", "speed", "--sizes", *map(str, args.sizes),
                           "--speed-popsizes", *map(str, args.speed_popsizes), *common], timeout=7200, env=env)
        if "error" in result:
            print(f"speed: {result['error']}")
        else:
            rows += result["rows"]
            by = {(r["params"], r["noise"]): r for r in result["rows"]}
            table = []
            for n, popsize in zip(args.sizes, args.speed_popsizes):
                full = by[(n * n, "gaussian")]["cpu_s_per_gen"]
                table.append([f"{n}x{n} ({n * n:,})", popsize,
                              *[f"{by[(n * n, noise)]['cpu_s_per_gen']:.3g} / {by[(n * n, noise)]['s_per_gen']:.3g}"
                                for noise in NOISES],
                              f"{full / by[(n * n, 'lowrank')]['cpu_s_per_gen']:.1f}x",
                              f"{full / by[(n * n, 'lowrank-factored')]['cpu_s_per_gen']:.1f}x"])
            lines.append(markdown_table(
                ["params", "popsize", *[f"{noise} CPU / wall s/gen" for noise in NOISES], "gaussian / lowrank (CPU)",
                 "gaussian / factored (CPU)"], table))
    if args.part in ("throughput", "both"):
        extra = ["--popsize", str(args.popsize), "--inputs", str(args.inputs), "--widths", *map(str, args.widths)]
        if args.eval_batch_size:
            extra += ["--eval-batch-size", str(args.eval_batch_size)]
        result = run_child("experiments.bench.lowrank", ["--child", "throughput", *extra, *common], timeout=7200,
                           env=env)
        if "error" in result:
            print(f"throughput: {result['error']}")
        else:
            rows += result["rows"]
            r = result["rows"][0]
            lines.append(markdown_table(
                ["MLP", "params", "popsize x inputs", "eval batch", "ES passes/s", "inference passes/s (same batches)",
                 "ES / inference (wall; CPU)", "inference passes/s (one batch)",
                 "ES / one-batch inference (wall; CPU)"],
                [["-".join(map(str, r["widths"])), f"{r['params']:,}", f"{r['popsize']} x {r['inputs']}",
                  r["eval_batch_size"], f"{r['es_passes_per_s']:,.0f}", f"{r['inference_passes_per_s']:,.0f}",
                  f"{r['ratio']:.0%}; {r['cpu_ratio']:.0%}", f"{r['inference_one_batch_passes_per_s']:,.0f}",
                  f"{r['ratio_one_batch']:.0%}; {r['cpu_ratio_one_batch']:.0%}"]]))
    text = "\n\n".join(lines)
    write_results(args.out, rows, text)


if __name__ == "__main__":
    main()
