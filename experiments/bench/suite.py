"""es.OpenES against evosax's Open_ES, side by side, in one invocation.

    python -m experiments.bench.suite            # the full grid (tens of minutes on 2 CPU cores)
    python -m experiments.bench.suite --quick    # a subset, under 5 minutes on 2 CPU cores
    python -m experiments.bench.suite --out /tmp/suite.json   # also writes /tmp/suite.md and /tmp/suite.png
    python -m experiments.bench.suite --sphere 1000000x1024 100000x4096 --no-tasks --out /tmp/targets.json
    python -m experiments.bench.suite --sphere --eval-batch-size 256   # the tasks, es evaluating 256 at once

Every implementation of a configuration runs in its own long-lived worker
process (compiled once, then timed on command), and the parent alternates
them round by round, rotating the order, so slow drifts of a shared machine
hit all of them alike. Reported: medians over rounds of seconds per
generation, throughput in member·params per second and its ratio to evosax,
peak RSS of each worker, and XLA's own estimate of the program's memory.

Implementations (same popsize, params, sigma, optimizer, antithetic pairs and
centered-rank shaping):
- ``es PRNG``: ``es.OpenES`` with the default ``es.GaussianNoise()``;
- ``es table``: ``es.OpenES(noise=es.NoiseTable())`` (2**25 floats). ``evolve``
  builds the table at the start of every call (a long run pays it once), so
  this worker times calls of G and of 2G generations back to back: their
  difference gives the steady-state seconds per generation, and the rest the
  per-call build, reported next to it;
- ``evosax``: ``evosax.algorithms.Open_ES``, written the way a competent user
  writes it: ``jit`` of a ``lax.scan`` over ask / vmapped fitness / tell.

Also measured, each in its own process: bytes crossing devices per generation
(``es.collectives_report`` on 8 emulated CPU devices) and the reconstruction
throughput (noise floats rebuilt and summed per second) against this
machine's memory bandwidth, timed in the same process.

Configurations whose compiled program needs more memory than the limit
(``--mem-limit-gib``, default min(16, 3/4 of available)) are reported as
"OOM (predicted)" from XLA's memory analysis without running; a worker that
runs out anyway (RLIMIT_AS) is reported as "OOM". Nothing crashes the suite.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import resource
import subprocess
import sys
import threading
import time

from experiments.bench import common
from experiments.bench.common import machine_description, markdown_table, median, peak_rss_bytes

IMPLEMENTATIONS = ("es PRNG", "es table", "evosax")
SPHERE_FULL = [(d, p) for d in (1_000, 100_000, 1_000_000) for p in (256, 1024, 4096)]
SPHERE_QUICK = [(1_000, 256), (100_000, 1024), (1_000_000, 256)]
TASKS = ("CartPole-v1", "Pendulum-v1")
TASK_POPSIZE = 256
SIGMA = 0.01
LEARNING_RATE = 0.01
TABLE_SIZE = 2**25
RECONSTRUCTION_POPSIZE = 1024
RESULTS = os.path.join(os.path.dirname(__file__), "results")


# --------------------------------------------------------------------------- workers


def _emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def _build(spec: dict, generations: int):
    """(compiled, args) of ``generations`` generations of one implementation on one problem."""
    import jax
    import jax.numpy as jnp
    import optax

    dim, popsize = spec["params"], spec["popsize"]
    key = jax.random.key(0)
    if spec["problem"] == "sphere":
        params = jnp.full((dim,), 0.5, jnp.float32)

        def fitness(x, key):
            del key
            return -jnp.sum(x * x)
    else:
        import tasks

        task = tasks.make(spec["problem"])
        params = task.init_params(key)
        fitness = task.fitness  # fitness(params, key); an es.StatefulFitness with observation normalisation
    optimizer = optax.adam(LEARNING_RATE)

    if spec["impl"].startswith("es"):
        import es

        noise = es.NoiseTable(size=TABLE_SIZE) if spec["impl"] == "es table" else es.GaussianNoise()
        strategy = es.OpenES(popsize=popsize, sigma=SIGMA, optimizer=optimizer, noise=noise)
        state = strategy.init(key, params, fitness=fitness)
        batch = spec.get("eval_batch_size")
        run = jax.jit(lambda s: es.evolve(strategy, fitness, s, generations, eval_batch_size=batch))
        return run.lower(state).compile(), (state,)

    from evosax.algorithms import Open_ES

    algorithm = Open_ES(
        population_size=popsize,
        solution=params,
        optimizer=optimizer,
        std_schedule=optax.constant_schedule(SIGMA),
    )
    hyperparams = algorithm.default_params
    state = algorithm.init(key, params, hyperparams)
    minimise = jax.vmap(lambda x, k: -fitness(x, k))  # evosax minimises

    def run(state, key):
        def generation(state, key):
            ask_key, eval_key, tell_key = jax.random.split(key, 3)
            population, state = algorithm.ask(ask_key, state, hyperparams)
            values = minimise(population, jax.random.split(eval_key, popsize))
            state, metrics = algorithm.tell(tell_key, population, values, state, hyperparams)
            return state, metrics["best_fitness"]

        return jax.lax.scan(generation, state, jax.random.split(key, generations))

    return jax.jit(run).lower(state, key).compile(), (state, key)


def _virtual_bytes() -> int:
    """This process's virtual memory size (what RLIMIT_AS limits)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _is_oom(error: BaseException) -> bool:
    text = f"{type(error).__name__} {error}"
    return isinstance(error, MemoryError) or "RESOURCE_EXHAUSTED" in text or "Out of memory" in text


def worker(spec: dict) -> None:
    """Compile, report, then time one call per ``run`` line on stdin until ``quit``.

    An implementation with one-time work inside every call (``es table``
    builds its table) is also compiled for twice the generations, and each
    ``run`` times both programs back to back: the difference is the time of
    ``generations`` steady-state generations, the rest is the per-call setup.
    """
    import jax

    limit = spec.get("mem_limit_bytes")
    if limit and jax.default_backend() == "cpu":  # RLIMIT_AS would break accelerator runtimes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    generations = spec["generations"]
    try:
        start = time.perf_counter()
        compiled, args = _build(spec, generations)
        doubled = _build(spec, 2 * generations) if spec["impl"] == "es table" else None
        compile_seconds = time.perf_counter() - start
        memory = compiled.memory_analysis()
        xla_bytes = None
        if memory is not None:
            xla_bytes = memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes
        # On a CPU the program shares the process's memory; an accelerator's is its own (and CUDA reserves tens of
        # GiB of address space, which _virtual_bytes would count).
        in_use = _virtual_bytes() if jax.default_backend() == "cpu" else 0
        if limit and xla_bytes and xla_bytes + in_use > limit:
            _emit({"status": "oom-predicted", "xla_bytes": xla_bytes})
            return

        def call(program):
            return common.timed(lambda: jax.block_until_ready(program[0](*program[1])), 1)[0]

        first_call = call((compiled, args)) + (call(doubled) if doubled else 0.0)
        num_params = sum(x.size for x in jax.tree.leaves(args[0].params if spec["impl"].startswith("es") else args[0].mean))
        _emit({"status": "ready", "compile_s": compile_seconds, "first_call_s": first_call, "xla_bytes": xla_bytes,
               "num_params": int(num_params)})
        for line in sys.stdin:
            if line.strip() != "run":
                break
            single = call((compiled, args))
            answer = {"call_s": single, "seconds": single}
            if doubled:
                twice = call(doubled)
                answer.update(seconds=twice - single, setup_s=2 * single - twice)
            _emit(answer)
        _emit({"peak_rss_bytes": peak_rss_bytes()})
    except Exception as error:  # reported to the parent, which records it and carries on
        _emit({"status": "oom" if _is_oom(error) else "error", "error": f"{type(error).__name__}: {error}"[:400]})


class Worker:
    """A worker process driven line by line, with a timeout on every answer."""

    def __init__(self, spec: dict):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "experiments.bench.suite", "--worker", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.answers: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            try:
                self.answers.put(json.loads(line))
            except json.JSONDecodeError:
                continue
        self.answers.put(None)

    def receive(self, timeout: float) -> dict:
        try:
            answer = self.answers.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            return {"status": "error", "error": f"no answer within {timeout:.0f} s (killed)"}
        if answer is None:
            code = self.proc.wait()
            tail = "".join(self.stderr[-3:]).strip()[-300:]
            status = "oom" if code in (-9, -6) or "RESOURCE_EXHAUSTED" in tail or "MemoryError" in tail else "error"
            return {"status": status, "error": f"worker exited with {code}: {tail}"}
        return answer

    def send(self, command: str) -> None:
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def measure(specs: dict[str, dict], rounds: int, timeout: float) -> dict[str, dict]:
    """Run the implementations of one configuration in alternation; return one record per implementation."""
    workers = {name: Worker(spec) for name, spec in specs.items()}
    records = {name: dict(worker.receive(timeout)) for name, worker in workers.items()}
    live = [name for name in workers if records[name].get("status") == "ready"]
    for name in live:
        records[name]["seconds"] = []
    for round_index in range(rounds):
        order = live[round_index % len(live):] + live[: round_index % len(live)] if live else []
        for name in order:
            if records[name]["status"] != "ready":
                continue
            workers[name].send("run")
            answer = workers[name].receive(timeout)
            if "seconds" in answer:
                records[name]["seconds"].append(answer["seconds"])
                if "setup_s" in answer:
                    records[name].setdefault("setup_s", []).append(answer["setup_s"])
            else:
                records[name].update(answer)
    for name in live:
        if records[name]["status"] == "ready":
            workers[name].send("quit")
            records[name].update(workers[name].receive(timeout))
    for worker in workers.values():
        worker.send("quit")
        try:
            worker.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
    return records


# --------------------------------------------------------------------------- other children


def bytes_child(configs: list[list[int]]) -> None:
    """Bytes crossing 8 emulated devices per generation, per configuration and exchange mode."""
    import jax
    import jax.numpy as jnp

    import es

    mesh = es.make_mesh(8)
    rows = []
    for dim, popsize in configs:
        row = {"params": dim, "popsize": popsize}
        for exchange in ("fitness", "gradient"):
            strategy = es.OpenES(popsize=popsize, sigma=SIGMA)
            state = strategy.init(jax.random.key(0), jnp.zeros(dim))
            report = es.collectives_report(strategy, lambda x, k: -jnp.sum(x * x), state, mesh, exchange=exchange)
            row[exchange] = report.total_bytes
        rows.append(row)
    _emit({"rows": rows})


def reconstruction_child(dims: list[int]) -> None:
    """Memory bandwidth, and noise floats rebuilt and summed per second, timed in this process."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import es
    from es.engine import members as population
    from es.engine import sums

    def best_of(fn, repeats=5):
        fn()  # warm up (compile)
        return min(common.timed(fn, repeats))

    def bandwidths(n=2**27):  # 512 MiB of float32, freed on return
        source = np.ones(n, np.float32)
        target = np.empty_like(source)
        copy_gbs = 2 * 4 * n / best_of(lambda: np.copyto(target, source)) / 1e9  # read + write
        device_array = jnp.asarray(source)
        total = jax.jit(jnp.sum)
        return copy_gbs, 4 * n / best_of(lambda: total(device_array).block_until_ready()) / 1e9

    copy_gbs, read_gbs = bandwidths()

    key = jax.random.key(0)
    table_build = jax.jit(es.NoiseTable(size=TABLE_SIZE).prepare, static_argnums=0)
    table_build_s = best_of(lambda: table_build(es.Layout(((1,),))).block_until_ready(), repeats=3)
    rows = []
    popsize = RECONSTRUCTION_POPSIZE
    for dim in dims:
        repeats = 3 if dim <= 100_000 else 1
        weights = jnp.linspace(-0.5, 0.5, popsize)
        members = jnp.arange(popsize, dtype=jnp.int32)
        gen_key = population.generation_key(key, jnp.int32(0))
        vectors = popsize // 2
        row = {"params": dim, "noise_vectors": vectors}
        for name, noise in (("es PRNG", es.GaussianNoise()), ("es table", es.NoiseTable(size=TABLE_SIZE))):
            aux = jax.block_until_ready(jax.jit(noise.prepare, static_argnums=0)(es.Layout(((dim,),))))
            batch = es.engine.batching.default_update_batch_size(dim)

            def rebuild(aux, w, noise=noise, batch=batch, dim=dim):
                generation = population.Generation(noise, aux, gen_key, jnp.zeros(dim), 1.0, True, vectors=vectors)
                return sums.rebuild(generation, es.Coefficients(w), members, batch).linear

            rebuild = jax.jit(rebuild)
            seconds = best_of(lambda: rebuild(aux, weights).block_until_ready(), repeats)
            row[name] = vectors * dim / seconds
        draw = jax.jit(lambda k, dim=dim: jax.random.normal(k, (vectors, dim)))  # what evosax's ask draws
        row["evosax normal draw"] = vectors * dim / best_of(lambda: draw(key).block_until_ready(), repeats)
        rows.append(row)
    _emit({"copy_gbs": copy_gbs, "read_gbs": read_gbs, "table_build_s": table_build_s, "rows": rows})


def run_child(args: list[str], env: dict | None = None, timeout: float = 900) -> dict:
    """Run ``python -m experiments.bench.suite args`` and parse its last JSON line (``{"error": ...}`` if none)."""
    return common.run_child("experiments.bench.suite", args, timeout=timeout, env=env)


# --------------------------------------------------------------------------- report


def generations_for(dim: int, popsize: int, work: float) -> int:
    """Generations per timed call: about ``work`` member·params, between 1 and 200."""
    return int(min(200, max(1, round(work / (dim * popsize)))))


def _gib(value) -> str:
    return "-" if value is None else f"{value / 2**30:.2f}"


def _status(record: dict) -> str:
    status = record.get("status", "error")
    if status == "ready" and record.get("seconds"):
        return "ok"
    return {"oom-predicted": "OOM (predicted)", "oom": "OOM"}.get(status, "error")


def summarise(record: dict, dim: int, popsize: int) -> dict:
    """Median seconds per generation and throughput of one implementation's record."""
    seconds = record.get("seconds") or []
    out = {"status": _status(record), "peak_rss_bytes": record.get("peak_rss_bytes"),
           "xla_bytes": record.get("xla_bytes"), "error": record.get("error")}
    if out["status"] == "ok":
        out["setup_s"] = median(record["setup_s"]) if record.get("setup_s") else 0.0
        per_generation = median(seconds) / record["generations"]
        out.update(s_per_gen=per_generation, throughput=dim * popsize / per_generation, rounds=len(seconds))
    return out


def cell_time(summary: dict) -> str:
    return f"{summary['s_per_gen']:.4g}" if summary["status"] == "ok" else summary["status"]


def ratio(ours: dict, theirs: dict) -> str:
    """Our throughput over theirs (= their seconds per generation over ours)."""
    if ours["status"] != "ok":
        return "-"
    if theirs["status"] != "ok":
        return f"({theirs['status']})"
    return f"{theirs['s_per_gen'] / ours['s_per_gen']:.2f}x"


def comparison_table(results: list[dict]) -> str:
    header = ["problem", "params", "popsize", "gens/call",
              "es PRNG s/gen", "es table s/gen (+ build s/call)", "evosax s/gen",
              "PRNG vs evosax", "table vs evosax",
              "es PRNG Mparam·member/s", "es table", "evosax"]
    rows = []
    for r in results:
        s = r["summary"]
        throughput = [f"{s[name]['throughput'] / 1e6:.0f}" if s[name]["status"] == "ok" else "-" for name in IMPLEMENTATIONS]
        times = [cell_time(s[name]) for name in IMPLEMENTATIONS]
        if s["es table"]["status"] == "ok":
            times[1] += f" (+ {max(s['es table']['setup_s'], 0.0):.2f})"  # a difference of two timings
        rows.append([r["problem"], f"{r['params']:,}", r["popsize"], r["generations"], *times,
                     ratio(s["es PRNG"], s["evosax"]), ratio(s["es table"], s["evosax"]), *throughput])
    return markdown_table(header, rows)


def memory_table(results: list[dict]) -> str:
    header = ["problem", "params", "popsize"] + [f"{n} peak RSS GiB" for n in IMPLEMENTATIONS] + [
        f"{n} XLA GiB" for n in IMPLEMENTATIONS]
    rows = []
    for r in results:
        s = r["summary"]
        rows.append([r["problem"], f"{r['params']:,}", r["popsize"],
                     *(_gib(s[n]["peak_rss_bytes"]) if s[n]["status"] == "ok" else s[n]["status"] for n in IMPLEMENTATIONS),
                     *(_gib(s[n]["xla_bytes"]) for n in IMPLEMENTATIONS)])
    return markdown_table(header, rows)


def bytes_table(result: dict) -> str:
    if "rows" not in result:
        return f"bytes crossing devices: {result.get('error', 'unavailable')}"
    header = ["params", "popsize", 'exchange="fitness" B/gen', "= 4·popsize", 'exchange="gradient" B/gen', "= 4·(popsize+params)"]
    rows = [[f"{r['params']:,}", r["popsize"], f"{r['fitness']:,}", f"{4 * r['popsize']:,}",
             f"{r['gradient']:,}", f"{4 * (r['popsize'] + r['params']):,}"] for r in result["rows"]]
    return markdown_table(header, rows)


def reconstruction_table(result: dict) -> str:
    if "rows" not in result:
        return f"reconstruction: {result.get('error', 'unavailable')}"
    read = result["read_gbs"] * 1e9 / 4  # floats per second a pure read streams
    header = ["params", "noise vectors", "es PRNG Mfloat/s", "es table Mfloat/s",
              "table reads / read bandwidth", "evosax's normal draw Mfloat/s"]
    rows = []
    for r in result["rows"]:
        rows.append([f"{r['params']:,}", r["noise_vectors"], f"{r['es PRNG'] / 1e6:.0f}", f"{r['es table'] / 1e6:.0f}",
                     f"{r['es table'] / read:.2f}", f"{r['evosax normal draw'] / 1e6:.0f}"])
    lines = [f"memory bandwidth (same process): copy {result['copy_gbs']:.1f} GB/s (read + write), "
             f"sum {result['read_gbs']:.1f} GB/s (read) = {read / 1e6:.0f} Mfloat/s; building the "
             f"{TABLE_SIZE:,}-float noise table takes {result['table_build_s']:.2f} s", "", markdown_table(header, rows)]
    return "\n".join(lines)


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sphere = [r for r in results if r["problem"] == "sphere"]
    popsizes = sorted({r["popsize"] for r in sphere})
    if not popsizes:
        return
    fig, axes = plt.subplots(1, len(popsizes), figsize=(4.5 * len(popsizes), 3.8), squeeze=False, sharey=True)
    for ax, popsize in zip(axes[0], popsizes):
        rows = sorted((r for r in sphere if r["popsize"] == popsize), key=lambda r: r["params"])
        for name, marker in zip(IMPLEMENTATIONS, "osx"):
            points = [(r["params"], r["summary"][name]["throughput"]) for r in rows if r["summary"][name]["status"] == "ok"]
            if points:
                ax.plot(*zip(*points), marker=marker, label=name)
            for r in rows:
                if r["summary"][name]["status"].startswith("OOM"):
                    ax.annotate(f"{name}: {r['summary'][name]['status']}", (r["params"], ax.get_ylim()[0]),
                                xytext=(0, 8), textcoords="offset points", ha="center", fontsize=8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"sphere, popsize {popsize:,}")
        ax.set_xlabel("params")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("member·params per second")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def tasks_available() -> dict[str, bool]:
    """Which of ``TASKS`` ``tasks.make`` can build here."""
    available = {}
    for name in TASKS:
        try:
            import tasks

            tasks.make(name)
            available[name] = True
        except Exception:
            available[name] = False
    return available


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a subset that finishes in under 5 minutes on 2 cores")
    parser.add_argument("--out", default=None, help="JSON results path (default experiments/bench/results/suite[-quick].json)")
    parser.add_argument("--rounds", type=int, default=None, help="timed calls per implementation (default 3 quick, 5 full)")
    parser.add_argument("--mem-limit-gib", type=float, default=None)
    parser.add_argument("--sphere", nargs="*", metavar="PARAMSxPOPSIZE", default=None,
                        help="sphere configurations to run instead of the grid, e.g. 1000000x1024 (none: only tasks)")
    parser.add_argument("--no-tasks", action="store_true", help="skip CartPole-v1 and Pendulum-v1")
    parser.add_argument("--eval-batch-size", type=int, default=None, help="es's members per evaluation batch "
                        "(default: es.evolve's, which divides the population on 1, 2, 4 and 8 devices alike)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--bytes-child", help=argparse.SUPPRESS)
    parser.add_argument("--reconstruction-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    if args.bytes_child:
        return bytes_child(json.loads(args.bytes_child))
    if args.reconstruction_child:
        return reconstruction_child(json.loads(args.reconstruction_child))

    began = time.perf_counter()
    rounds = args.rounds or (3 if args.quick else 5)
    work = 3e8 if args.quick else 1e9
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    limit_gib = args.mem_limit_gib or min(16.0, 0.75 * available / 2**30)
    limit = int(limit_gib * 2**30)
    out = args.out or os.path.join(RESULTS, "suite-quick.json" if args.quick else "suite.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    machine = machine_description()
    print(f"# es vs evosax ({'quick' if args.quick else 'full'}), machine: {machine}", flush=True)
    print(f"# rounds {rounds}, memory limit per worker {limit_gib:.1f} GiB, es eval_batch_size "
          f"{args.eval_batch_size or 'default'}", flush=True)

    grid = SPHERE_QUICK if args.quick else SPHERE_FULL
    if args.sphere is not None:
        grid = [tuple(int(float(v)) for v in config.lower().split("x")) for config in args.sphere]
    configs = [("sphere", d, p) for d, p in grid]
    skipped = []
    for name, ok in ({} if args.no_tasks else tasks_available()).items():
        if ok:
            configs.append((name, 0, TASK_POPSIZE))
        else:
            skipped.append(f"{name}: skipped: tasks.make('{name}') unavailable")
            print(skipped[-1], flush=True)

    results = []
    for problem, dim, popsize in configs:
        generations = generations_for(dim, popsize, work) if problem == "sphere" else (3 if args.quick else 10)
        spec = {"problem": problem, "params": dim, "popsize": popsize, "generations": generations,
                "mem_limit_bytes": limit, "eval_batch_size": args.eval_batch_size}
        records = measure({name: {**spec, "impl": name} for name in IMPLEMENTATIONS}, rounds, timeout=900)
        for record in records.values():
            record["generations"] = generations
        dim = next((r["num_params"] for r in records.values() if "num_params" in r), dim)  # tasks: the policy's
        summary = {name: summarise(records[name], dim, popsize) for name in IMPLEMENTATIONS}
        results.append({"problem": problem, "params": dim, "popsize": popsize, "generations": generations,
                        "records": records, "summary": summary})
        cells = ", ".join(f"{name} {cell_time(summary[name])}" for name in IMPLEMENTATIONS)
        print(f"{problem} params={dim:,} popsize={popsize:,} ({generations} gens/call): s/gen {cells} "
              f"[{time.perf_counter() - began:.0f} s]", flush=True)
        for name in IMPLEMENTATIONS:
            if summary[name]["error"]:
                print(f"  {name}: {summary[name]['error']}", flush=True)

    sphere_configs = [[d, p] for problem, d, p in configs if problem == "sphere"]
    bytes_configs = sphere_configs if not args.quick else sphere_configs[:2]
    crossing = {"error": "no sphere configuration was run"}
    if bytes_configs:
        crossing = run_child(["--bytes-child", json.dumps(bytes_configs)],
                             env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    print(f"bytes crossing devices measured [{time.perf_counter() - began:.0f} s]", flush=True)
    reconstruction = run_child(["--reconstruction-child", json.dumps([100_000] if args.quick else [100_000, 1_000_000])])
    print(f"reconstruction measured [{time.perf_counter() - began:.0f} s]", flush=True)

    sections = [
        f"Machine: {machine}. Rounds: {rounds} (medians); memory limit per worker {limit_gib:.1f} GiB; es "
        f"eval_batch_size {args.eval_batch_size or 'default'}.",
        "",
        "### Time per generation and throughput (ratios: es throughput / evosax throughput)",
        "",
        comparison_table(results),
        "",
        *([*skipped, ""] if skipped else []),
        "### Peak RSS per worker process, and XLA's compiled memory estimate",
        "",
        memory_table(results),
        "",
        "### Bytes crossing devices per generation (8 emulated CPU devices, from the compiled HLO)",
        "",
        bytes_table(crossing),
        "",
        f"### Reconstruction throughput (popsize {RECONSTRUCTION_POPSIZE:,}: noise vectors rebuilt and summed)",
        "",
        reconstruction_table(reconstruction),
    ]
    markdown = "\n".join(sections)
    print()
    print(markdown)
    stem = os.path.splitext(out)[0]
    with open(out, "w") as f:
        json.dump({"machine": machine, "quick": args.quick, "rounds": rounds, "mem_limit_gib": limit_gib,
                   "skipped": skipped, "results": results, "bytes": crossing, "reconstruction": reconstruction,
                   "seconds": time.perf_counter() - began}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(markdown + "\n")
    plot(results, stem + ".png")
    print(f"\nwrote {out}, {stem}.md, {stem}.png in {time.perf_counter() - began:.0f} s", flush=True)


if __name__ == "__main__":
    main()
