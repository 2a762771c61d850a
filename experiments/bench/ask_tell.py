"""What one generation of ``es.ask`` + ``es.tell`` costs, against pycma's ``ask`` + ``tell``, in one process.

    python -m experiments.bench.ask_tell                      # D=10, popsize 10 (about a minute)
    python -m experiments.bench.ask_tell --dim 20 --popsize 12 --rounds 20 --out /tmp/ask_tell.json

The per-generation overhead of driving a strategy from Python, which is what
an optimiser of a host function (a COCO problem, a simulator) pays on top of
its evaluations. Runners (``RUNNERS``), all on the same problem:

- ``es.CMAES`` and ``es.SepCMAES`` with float32 params, and with float64
  params under ``jax.enable_x64(True)`` (entered once per block of
  generations, as a loop would);
- pycma's ``cma.CMAEvolutionStrategy``, and its separable variant
  (``{"CMA_diagonal": True}``: diagonal covariance throughout), the
  counterparts of ``es.CMAES`` and ``es.SepCMAES``;
- ``es.minimize``'s own loop (``es.engine.loop.Loop``, float64): one compiled
  call a generation (the tell and the next members), in a program padded to
  ``PADDED`` times the popsize, as the first program of a BIPOP schedule
  (``es.blackbox.restarts.program_popsizes``) serves its first runs: what a
  generation of ``es.minimize`` costs beside its evaluations.

One generation: ``ask`` (for es, with the members brought to a numpy array),
the fitness (the sphere in numpy, not timed) and ``tell`` (for es, until the
new state is ready: ``jax.block_until_ready``). Timed: ask and tell. Every
runner starts at x0 = 1 (D ones) with sigma 0.5 and popsize ``--popsize``, and
starts afresh, untimed, every ``RESET_EVERY`` generations (so no run reaches
a degenerate state); es's compiled programs stay cached across restarts.

After its first generation (timed apart: ``first gen ms``, compilation
included, with the compilations counted) and ``--warmup`` more, the runners
take turns for ``--rounds`` rounds of ``--generations`` generations each (the
order rotating from round to round, so a shared machine's drift hits all of
them alike). Reported: the median milliseconds of ask, of tell and of the
generation, and the ratio of es's generation to its pycma counterpart's
(below 1: es is cheaper), and the median CPU seconds of the generation
(``time.process_time``: every thread of the process; JAX's CPU runtime runs
programs on its own threads, so on a loaded machine es's wall time also
waits for those threads to be scheduled). ``--sync-dispatch`` sets
``jax_cpu_enable_async_dispatch=False`` (small programs run inline on the
calling thread) to show what the handoff costs. ``restart ms`` is es's first generation of a fresh
strategy with twice the popsize once everything else is warm: the cost of a
BIPOP/IPOP restart that meets a new popsize, compilations included.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from typing import Any, Callable

import numpy as np

from experiments.bench.common import CompileClock, machine_description, markdown_table, median, write_results

DIM = 10
POPSIZE = 10
SIGMA = 0.5
RESET_EVERY = 100
RUNNERS = (  # (name, library, strategy, float64)
    ("es.CMAES float32", "es", "CMAES", False),
    ("es.CMAES float64", "es", "CMAES", True),
    ("es.SepCMAES float32", "es", "SepCMAES", False),
    ("es.SepCMAES float64", "es", "SepCMAES", True),
    ("es.minimize loop, padded", "es-loop", "CMAES", True),
    ("pycma CMA-ES", "pycma", "full", True),
    ("pycma sep-CMA-ES", "pycma", "diagonal", True),
)
COUNTERPART = {"CMAES": "pycma CMA-ES", "SepCMAES": "pycma sep-CMA-ES"}
PADDED = 4
"""The loop runner's program has ``PADDED x popsize`` members (a run of ``popsize``)."""
RESULTS = os.path.join(os.path.dirname(__file__), "results")


def sphere(population: np.ndarray) -> np.ndarray:
    return np.sum(np.square(population, dtype=np.float64), axis=-1)


def timed_generation(ask: Callable[[], Any], tell: Callable[[Any, np.ndarray], None]) -> tuple[float, float, float]:
    """One generation: ``ask()`` (the population), the sphere on it (not timed), ``tell(population, fitness)``;
    ``(ask seconds, tell seconds, CPU seconds of both)``."""
    cpu_start, start = time.process_time(), time.perf_counter()
    population = ask()
    asked, cpu_asked = time.perf_counter(), time.process_time()
    fitness = sphere(np.asarray(population))
    cpu_told, told = time.process_time(), time.perf_counter()
    tell(population, fitness)
    end, cpu_end = time.perf_counter(), time.process_time()
    return asked - start, end - told, (cpu_asked - cpu_start) + (cpu_end - cpu_told)


class EsRunner:
    """``es.ask`` + ``es.tell`` of one es strategy, minimising the sphere from x0 = 1."""

    def __init__(self, strategy: str, dim: int, popsize: int, x64: bool, seed: int = 0):
        import es

        self.strategy = getattr(es, strategy)(popsize=popsize, sigma=SIGMA, maximize=False)
        self.dim, self.x64, self.seed, self.resets = dim, x64, seed, 0
        self.state = None

    def context(self):
        import jax

        return jax.enable_x64(True) if self.x64 else contextlib.nullcontext()

    def reset(self) -> None:
        import jax

        self.resets += 1
        x0 = np.ones(self.dim, np.float64 if self.x64 else np.float32)
        self.state = jax.block_until_ready(self.strategy.init(jax.random.key(self.seed + self.resets), x0))
        self.generation_count = 0

    def generation(self) -> tuple[float, float, float]:
        """One generation; ``(ask seconds, tell seconds, CPU seconds of both)``. Call within ``self.context()``."""
        import jax

        import es

        if self.state is None or self.generation_count >= RESET_EVERY:
            self.reset()

        def tell(population, fitness):
            self.state = jax.block_until_ready(es.tell(self.strategy, self.state, fitness)[0])

        times = timed_generation(lambda: np.asarray(es.ask(self.strategy, self.state)), tell)
        self.generation_count += 1
        return times


class LoopRunner:
    """``es.minimize``'s loop in float64 (``es.engine.loop.Loop``), minimising the sphere from x0 = 1: the members
    come with the previous generation's call, and ``tell`` is the step that tells and builds the next ones."""

    def __init__(self, dim: int, popsize: int, seed: int = 0):
        import es

        self.strategy = es.CMAES(popsize=popsize, sigma=SIGMA, maximize=False)
        self.dim, self.seed, self.resets = dim, seed, 0
        self.loop = self.compiled = None

    def context(self):
        import jax

        return jax.enable_x64(True)

    def reset(self) -> None:
        import jax

        from es.engine import loop

        self.resets += 1
        x0 = np.ones(self.dim)
        popsize = PADDED * self.strategy.popsize
        if self.compiled is None:
            self.compiled = loop.Loop.compile(loop.resized(self.strategy, popsize), x0)
        state = self.strategy.init(jax.random.key(self.seed + self.resets), x0)
        self.loop = loop.Loop(self.strategy, state, self.compiled, popsize=popsize)
        self.members = self.loop.first()
        self.generation_count = 0

    def generation(self) -> tuple[float, float, float]:
        if self.loop is None or self.generation_count >= RESET_EVERY:
            self.reset()

        def tell(population, fitness):
            self.members = self.loop.step(fitness)[1]

        times = timed_generation(lambda: np.asarray(self.members), tell)
        self.generation_count += 1
        return times


class PycmaRunner:
    """pycma's ``ask`` + ``tell``, minimising the sphere from x0 = 1 (``diagonal``: ``CMA_diagonal=True``)."""

    def __init__(self, variant: str, dim: int, popsize: int, seed: int = 1):
        self.options = {"popsize": popsize, "seed": seed, "verbose": -9, "CMA_diagonal": variant == "diagonal"}
        self.dim = dim
        self.cma = None

    def context(self):
        return contextlib.nullcontext()

    def reset(self) -> None:
        import cma

        self.options["seed"] += 1
        self.cma = cma.CMAEvolutionStrategy(np.ones(self.dim), SIGMA, self.options)
        self.generation_count = 0

    def generation(self) -> tuple[float, float, float]:
        if self.cma is None or self.generation_count >= RESET_EVERY:
            self.reset()
        times = timed_generation(self.cma.ask, self.cma.tell)
        self.generation_count += 1
        return times


def make_runner(library: str, strategy: str, x64: bool, dim: int, popsize: int):
    if library == "es-loop":
        return LoopRunner(dim, popsize)
    return EsRunner(strategy, dim, popsize, x64) if library == "es" else PycmaRunner(strategy, dim, popsize)


def run_block(runner, generations: int) -> list[tuple[float, float, float]]:
    with runner.context():
        return [runner.generation() for _ in range(generations)]


def measure(dim: int = DIM, popsize: int = POPSIZE, rounds: int = 10, generations: int = 100, warmup: int = 50,
            runners=RUNNERS, log=print) -> list[dict]:
    """One row per runner: medians of ask, tell and generation (ms), first generation and restart (es)."""
    import jax

    import es  # noqa: F401  (imported before any clock)

    if any(library == "pycma" for _, library, _, _ in runners):
        import cma  # noqa: F401

    jax.block_until_ready(jax.numpy.zeros(1))  # the backend starts before anything is timed
    with jax.enable_x64(True):
        jax.block_until_ready(jax.numpy.zeros(1))
    rows = {name: {"name": name, "library": library, "strategy": strategy, "float64": x64, "ask_s": [],
                   "tell_s": [], "cpu_s": []} for name, library, strategy, x64 in runners}
    live = {}
    with CompileClock() as clock:
        for name, library, strategy, x64 in runners:
            live[name] = runner = make_runner(library, strategy, x64, dim, popsize)
            rows[name].update(first_generation(clock, runner, "first_gen"))
            run_block(runner, warmup)
        names = list(live)
        for round_index in range(rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                for ask_s, tell_s, cpu_s in run_block(live[name], generations):
                    rows[name]["ask_s"].append(ask_s)
                    rows[name]["tell_s"].append(tell_s)
                    rows[name]["cpu_s"].append(cpu_s)
            log(f"round {round_index + 1}/{rounds}: " + ", ".join(
                f"{n} {1e3 * median([a + t for a, t in zip(rows[n]['ask_s'], rows[n]['tell_s'])]):.3f} ms"
                for n in names))
        for name, library, strategy, x64 in runners:  # a restart: a fresh strategy, twice the popsize
            if library != "es":
                continue
            rows[name].update(first_generation(clock, make_runner(library, strategy, x64, dim, 2 * popsize), "restart"))
    return [summarise(row) for row in rows.values()]


def first_generation(clock: CompileClock, runner, prefix: str) -> dict:
    """A runner's first generation: its wall seconds, and the seconds and programs JAX compiled for it."""
    before = (clock.seconds, clock.compiles)
    start = time.perf_counter()
    with clock.measuring():
        run_block(runner, 1)
    return {f"{prefix}_s": time.perf_counter() - start, f"{prefix}_compile_s": clock.seconds - before[0],
            f"{prefix}_compiles": clock.compiles - before[1]}


def summarise(row: dict) -> dict:
    ask, tell, cpu = row.pop("ask_s"), row.pop("tell_s"), row.pop("cpu_s")
    return {**row, "generations": len(ask), "ask_ms": 1e3 * median(ask), "tell_ms": 1e3 * median(tell),
            "gen_ms": 1e3 * median([a + t for a, t in zip(ask, tell)]), "cpu_ms": 1e3 * median(cpu)}


def with_ratios(rows: list[dict]) -> list[dict]:
    """es rows get ``baseline`` (their pycma counterpart) and ``ratio`` = es ms / pycma ms per generation."""
    by_name = {r["name"]: r for r in rows}
    for row in rows:
        baseline = by_name.get(COUNTERPART.get(row["strategy"], ""))
        if row["library"] in ("es", "es-loop") and baseline:
            row["baseline"], row["ratio"] = baseline["name"], row["gen_ms"] / baseline["gen_ms"]
    return rows


def table(rows: list[dict]) -> str:
    header = ["runner", "ask ms", "tell ms", "generation ms", "vs pycma", "generation CPU ms", "first gen ms (compiling ms, compiles)",
              "restart at 2x popsize ms (compiling ms, compiles)"]
    lines = []
    for r in rows:
        ratio = f"{r['ratio']:.2f}x {r['baseline']}" if "ratio" in r else "-"
        first = (f"{1e3 * r['first_gen_s']:,.0f} ({1e3 * r['first_gen_compile_s']:,.0f}, {r['first_gen_compiles']})"
                 if r["library"] != "pycma" else f"{1e3 * r['first_gen_s']:,.1f}")
        restart = (f"{1e3 * r['restart_s']:,.0f} ({1e3 * r['restart_compile_s']:,.0f}, {r['restart_compiles']})"
                   if "restart_s" in r else "-")
        lines.append([r["name"], f"{r['ask_ms']:.3f}", f"{r['tell_ms']:.3f}", f"{r['gen_ms']:.3f}", ratio,
                      f"{r['cpu_ms']:.3f}", first, restart])
    return markdown_table(header, lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=DIM)
    parser.add_argument("--popsize", type=int, default=POPSIZE)
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default %(default)s)")
    parser.add_argument("--generations", type=int, default=100, help="generations per runner and round")
    parser.add_argument("--warmup", type=int, default=50, help="untimed generations after the first")
    parser.add_argument("--sync-dispatch", action="store_true",
                        help="jax_cpu_enable_async_dispatch=False: run small CPU programs inline on the calling thread")
    parser.add_argument("--out", default=os.path.join(RESULTS, "ask_tell.json"),
                        help="JSON results path; its .md gets the table (default %(default)s)")
    args = parser.parse_args(argv)
    if args.sync_dispatch:
        import jax

        jax.config.update("jax_cpu_enable_async_dispatch", False)  # before the backend starts
    machine = machine_description()
    print(machine)
    started = time.perf_counter()
    rows = with_ratios(measure(args.dim, args.popsize, args.rounds, args.generations, args.warmup))
    text = (f"D={args.dim}, popsize {args.popsize}: medians over {args.rounds} x {args.generations} generations "
            f"per runner{'; jax_cpu_enable_async_dispatch=False' if args.sync_dispatch else ''}; {machine}\n\n"
            + table(rows))
    write_results(args.out, rows, text, {"dim": args.dim, "popsize": args.popsize, "rounds": args.rounds,
                                         "generations": args.generations, "warmup": args.warmup,
                                         "sync_dispatch": args.sync_dispatch,
                                         "seconds": time.perf_counter() - started})


if __name__ == "__main__":
    main()
