"""Time to a first result: each case in a fresh process, es against pycma or evosax side by side, cold and warm.

    python -m experiments.bench.first_result                     # every case, 3 rounds (about 15 minutes)
    python -m experiments.bench.first_result --cases readme jax10 --rounds 5
    python -m experiments.bench.first_result --cases evolve --strategies CMAES SNES

Cases (``CASES``), each run in a child process whose whole wall time (Python start, imports, the call) is
measured from outside, and whose own clock times the call:

- ``readme``: the README's ``es.minimize`` example (3-D Rastrigin in numpy, BIPOP, 10,000 evaluations, target
  1e-8, seed 1) against ``cma.fmin2`` on the same problem and budget (BIPOP, ``restarts=9``);
- ``jax10``: 10-D BIPOP Rastrigin as a JAX function, 1e5 evaluations, against pycma on its numpy twin;
- ``evolve``: the first ``es.evolve`` call of each strategy (D=10 sphere, popsize 16, 20 generations, one
  device) against the first call of evosax's counterpart (one jitted ``lax.scan`` of ask, evaluate and tell,
  as experiments/bench/strategies.py writes it); the call alone (the import is outside it for both);
- ``again``: what compiles a second time, in one process: a second ``es.evolve`` call from the state the first
  returned, a second ``es.run`` segment, a second ``es.ask``/``es.tell`` generation (counts of XLA compilations
  from ``jax.monitoring``, which must be 0), and a second process of the ``readme`` case with the same
  compilation cache (programs compiled there rather than loaded from the cache: must be 0).

es runs cold (an empty compilation cache of its own) and warm (the cache a previous process filled: the second
and later processes of a user who runs the same script again); pycma and evosax have nothing to cache. The
runners alternate within each round. Reported: medians over ``--rounds`` and the ratio es / baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from experiments.bench.common import markdown_table, write_results
from experiments.bench.compile_time import EVOSAX, STRATEGIES

RESULTS = os.path.join(os.path.dirname(__file__), "results")

README_ES = """
import numpy as np, es, time
def rastrigin(x):
    return float(10 * len(x) + np.sum(x**2 - 10 * np.cos(2 * np.pi * x)))
t = time.perf_counter()
result = es.minimize(rastrigin, np.full(3, 3.0), 2.0, max_evals=10_000, target=1e-8, restarts="bipop", seed=1)
print(RESULT, {"call_s": time.perf_counter() - t, "fun": result.fun, "nfev": result.nfev})
"""
README_PYCMA = """
import numpy as np, cma, time
def rastrigin(x):
    return float(10 * len(x) + np.sum(x**2 - 10 * np.cos(2 * np.pi * x)))
t = time.perf_counter()
x, run = cma.fmin2(rastrigin, np.full(3, 3.0), 2.0, {"maxfevals": 10_000, "ftarget": 1e-8, "seed": 1, "verbose": -9},
                   restarts=9, bipop=True)
print(RESULT, {"call_s": time.perf_counter() - t, "fun": run.result.fbest, "nfev": run.result.evaluations})
"""
JAX10_ES = """
import numpy as np, jax.numpy as jnp, es, time
def rastrigin(x):
    return 10 * x.shape[0] + jnp.sum(x**2 - 10 * jnp.cos(2 * jnp.pi * x))
t = time.perf_counter()
result = es.minimize(rastrigin, np.full(10, 3.0), 2.0, max_evals=100_000, restarts="bipop", seed=1)
print(RESULT, {"call_s": time.perf_counter() - t, "fun": result.fun, "nfev": result.nfev})
"""
JAX10_PYCMA = """
import numpy as np, cma, time
def rastrigin(x):
    return float(10 * len(x) + np.sum(x**2 - 10 * np.cos(2 * np.pi * x)))
t = time.perf_counter()
x, run = cma.fmin2(rastrigin, np.full(10, 3.0), 2.0, {"maxfevals": 100_000, "seed": 1, "verbose": -9},
                   restarts=9, bipop=True)
print(RESULT, {"call_s": time.perf_counter() - t, "fun": run.result.fbest, "nfev": run.result.evaluations})
"""
EVOLVE_ES = """
import time, jax, jax.numpy as jnp, es
strategy = es.STRATEGIES[NAME](popsize=16, sigma=0.3)
state = jax.block_until_ready(strategy.init(jax.random.key(0), jnp.ones(10)))
t = time.perf_counter()
jax.block_until_ready(es.evolve(strategy, lambda x, key: -jnp.sum(x * x), state, 20))
print(RESULT, {"call_s": time.perf_counter() - t})
"""
EVOLVE_EVOSAX = """
import time, jax
from experiments.bench.compile_time import evosax_scan
run, args = evosax_scan(NAME)
t = time.perf_counter()
jax.block_until_ready(run(*args))
print(RESULT, {"call_s": time.perf_counter() - t})
"""
AGAIN = """
import numpy as np, jax, jax.numpy as jnp, es
compiled = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kwargs: compiled.append(1) if event.endswith("backend_compile_duration") else None)
fitness = lambda x, key: -jnp.sum(x * x)
strategy = es.SNES(popsize=16, sigma=0.3)
state, _ = es.evolve(strategy, fitness, strategy.init(jax.random.key(0), jnp.ones(10)), 10)
before = len(compiled); es.evolve(strategy, fitness, state, 10); evolve_again = len(compiled) - before
segments = []
es.run(strategy, fitness, strategy.init(jax.random.key(1), jnp.ones(10)), 30, segment=10, progress=False,
       on_segment=lambda segment: segments.append(len(compiled)))
run_again = segments[-1] - segments[0]
state = strategy.init(jax.random.key(2), jnp.ones(10))
counts = []
for _ in range(3):
    state, _ = es.tell(strategy, state, np.asarray(jnp.sum(es.ask(strategy, state) ** 2, axis=1)))
    counts.append(len(compiled))
print(RESULT, {"evolve_again": evolve_again, "segments_after_the_first": run_again, "tell_after_the_first": counts[2] - counts[1]})
"""
CACHE_MISSES = """
import jax
misses = []
jax.monitoring.register_event_listener(lambda event, **kwargs: misses.append(1) if event.endswith("cache_misses") else None)
""" + README_ES.replace('print(RESULT, {', 'print(RESULT, {"cache_misses": len(misses), ')
RESULT = "RESULT"


def child(code: str, env: dict, timeout: float = 900) -> dict:
    """Run ``code`` in a fresh Python: ``{"wall_s", **what it printed after RESULT}`` or ``{"error"}``."""
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", f"RESULT = {RESULT!r}\n" + code], capture_output=True,
                              text=True, timeout=timeout, env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-400:]}"}
    return {"wall_s": wall, **eval(lines[-1][len(RESULT):])}  # a dict literal this script printed


def es_env(cache: str) -> dict:
    return {"ES_COMPILATION_CACHE": cache, "JAX_PLATFORMS": "cpu"}


def minimize_case(es_code: str, pycma_code: str, rounds: int) -> list[dict]:
    """Rows for cold es, warm es and pycma: wall and call seconds per round."""
    runs = {"es (cold cache)": [], "es (warm cache)": [], "pycma": []}
    for round_ in range(rounds):
        with tempfile.TemporaryDirectory() as cache:
            order = ["cold", "pycma"] if round_ % 2 == 0 else ["pycma", "cold"]
            for who in order:
                if who == "cold":
                    runs["es (cold cache)"].append(child(es_code, es_env(cache)))
                    runs["es (warm cache)"].append(child(es_code, es_env(cache)))
                else:
                    runs["pycma"].append(child(pycma_code, {}))
        print(json.dumps({name: values[-1] for name, values in runs.items()}), flush=True)
    return [summary(name, values) for name, values in runs.items()]


def evolve_case(names: list[str], rounds: int) -> list[dict]:
    rows = []
    for name in names:
        runs = {f"es.evolve {name} (cold cache)": [], f"evosax {EVOSAX[name]}": []}
        for round_ in range(rounds):
            with tempfile.TemporaryDirectory() as cache:
                jobs = [("es", EVOLVE_ES.replace("NAME", repr(name)), es_env(cache)),
                        ("evosax", EVOLVE_EVOSAX.replace("NAME", repr(name)), {})]
                for who, code, env in (jobs if round_ % 2 == 0 else jobs[::-1]):
                    label = f"es.evolve {name} (cold cache)" if who == "es" else f"evosax {EVOSAX[name]}"
                    runs[label].append(child(code, env))
            print(json.dumps({label: values[-1] for label, values in runs.items()}), flush=True)
        rows += [summary(label, values) for label, values in runs.items()]
    return rows


def again_case() -> list[dict]:
    with tempfile.TemporaryDirectory() as cache:
        counts = child(AGAIN, es_env(cache))
        child(README_ES, es_env(cache))  # the first process fills the cache
        second = child(CACHE_MISSES, es_env(cache))
    print(json.dumps({"again": counts, "second process": second}), flush=True)
    return [{"runner": "compiled again", **counts, "second_process_cache_misses": second.get("cache_misses")}]


def summary(name: str, values: list[dict]) -> dict:
    good = [v for v in values if "error" not in v]
    row = {"runner": name, "rounds": len(good), "errors": [v["error"] for v in values if "error" in v]}
    for key in ("wall_s", "call_s"):
        if good and all(key in v for v in good):
            row[key] = statistics.median(v[key] for v in good)
    return row


def table(rows: list[dict], baseline_of) -> str:
    lines = []
    for row in rows:
        if "wall_s" not in row:
            continue
        base = baseline_of(row["runner"])
        ratio = f"{row['wall_s'] / base['wall_s']:.2f}x" if base and base is not row else "-"
        call_ratio = f"{row['call_s'] / base['call_s']:.2f}x" if base and base is not row and "call_s" in row else "-"
        lines.append([row["runner"], f"{row['wall_s']:.2f}", f"{row.get('call_s', float('nan')):.2f}", ratio,
                      call_ratio, row["rounds"]])
    return markdown_table(["runner", "wall s (fresh process)", "call s", "wall / baseline", "call / baseline",
                           "rounds"], lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=["readme", "jax10", "evolve", "again"],
                        choices=["readme", "jax10", "evolve", "again"])
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(RESULTS, "first_result.json"))
    args = parser.parse_args(argv)
    sections, rows = [], []
    if "readme" in args.cases:
        found = minimize_case(README_ES, README_PYCMA, args.rounds)
        rows += found
        sections.append("README's es.minimize example (3-D Rastrigin, BIPOP, 1e4 evaluations):\n\n"
                        + table(found, lambda name: found[-1]))
    if "jax10" in args.cases:
        found = minimize_case(JAX10_ES, JAX10_PYCMA, args.rounds)
        rows += found
        sections.append("10-D BIPOP Rastrigin, a JAX function (pycma: its numpy twin), 1e5 evaluations:\n\n"
                        + table(found, lambda name: found[-1]))
    if "evolve" in args.cases:
        found = evolve_case(args.strategies, args.rounds)
        rows += found
        by_name = {row["runner"]: row for row in found}

        def evosax_row(runner: str):
            return by_name.get(f"evosax {EVOSAX[runner.split()[1]]}") if runner.startswith("es.") else None

        sections.append("The first es.evolve call (D=10 sphere, popsize 16, 20 generations) against evosax's first "
                        "jitted scan:\n\n" + table(found, evosax_row))
    if "again" in args.cases:
        found = again_case()
        rows += found
        row = found[0]
        sections.append(markdown_table(["what", "XLA compilations"], [
            ["a second es.evolve call (from the state the first returned)", row.get("evolve_again")],
            ["es.run's segments after the first", row.get("segments_after_the_first")],
            ["a generation of es.ask/es.tell after the first", row.get("tell_after_the_first")],
            ["a second process of the README example: programs not found in the cache",
             row.get("second_process_cache_misses")]]))
    write_results(args.out, rows, "\n\n".join(sections), {"rounds": args.rounds})


if __name__ == "__main__":
    main()
