"""How long es's programs take to compile: the cost of a first call, of a new popsize, and most of the test suite.

    python -m experiments.bench.compile_time                       # every program, 5 rounds (a few minutes)
    python -m experiments.bench.compile_time --rounds 3 --out /tmp/compile_time.json
    python -m experiments.bench.compile_time --compare OTHER_CHECKOUT   # this checkout and another, alternating

Programs (``PROGRAMS``): ``es.evolve`` of SNES on a 10-D sphere (one device), of OpenES on a small policy
rollout that uses its key (8 emulated CPU devices, as the tests run it), and of es.CMAES on a 10-D sphere,
minimising. Each round compiles each program afresh (``jax.jit(...).lower(state).compile()`` with a
generation count new to the round, so no cache serves it) and times it; reported: the median seconds over
the rounds (tracing, lowering and XLA's compilation together).

``--compare DIR`` runs this script in two child processes per round, one importing ``es`` from this checkout
and one from ``DIR`` (another checkout of the repository, e.g. ``git worktree add /tmp/base HEAD~1``), in
alternating order, and reports both and their ratio: a change's effect on compile time, side by side on the
same machine.

``--evosax`` compares each strategy's program with its evosax counterpart instead (``pip install -e
".[bench]"``): ``es.evolve`` of the strategy on a 10-D sphere (popsize 16, 20 generations, one device) against
evosax's jitted ``lax.scan`` of ask, evaluate and tell (``evosax_scan``, as experiments/bench/first_result.py
times it), each in a fresh process per round, alternating. Reported per program: compile seconds (tracing,
lowering and XLA's compilation), the fusions of the optimised HLO (on a CPU each is one compiled kernel, and
their number drives XLA's compile time) and its instructions.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time

from experiments.bench.common import markdown_table, write_results

RESULTS = os.path.join(os.path.dirname(__file__), "results")
DEVICES = 8


def _policy_return(params, key):
    """A 4-32-4 tanh policy for 16 steps of noisy linear dynamics (tests/test_engine.py's noisy_policy_return)."""
    import jax
    import jax.numpy as jnp

    def step(carry, step_key):
        obs, total = carry
        action = jnp.tanh(jnp.tanh(obs @ params["w1"]) @ params["w2"])
        obs = 0.9 * obs + 0.1 * action + 0.05 * jax.random.normal(step_key, obs.shape)
        return (obs, total - jnp.sum(obs**2)), None

    (_, total), _ = jax.lax.scan(step, (jnp.ones(4), 0.0), jax.random.split(key, 16))
    return total


def programs():
    """``name -> (strategy, fitness_fn, state, mesh)``."""
    import jax
    import jax.numpy as jnp
    import optax

    import es

    snes = es.SNES(popsize=16, sigma=0.3)
    openes = es.OpenES(popsize=32, sigma=0.1, optimizer=optax.adam(0.05))
    cmaes = es.CMAES(popsize=10, sigma=0.5, maximize=False)
    policy = {"w1": 0.1 * jax.random.normal(jax.random.key(1), (4, 32)),
              "w2": 0.1 * jax.random.normal(jax.random.key(2), (32, 4))}
    return {
        "SNES, 10-D sphere, 1 device": (snes, lambda x, key: -jnp.sum(x * x), snes.init(jax.random.key(0), jnp.ones(10)),
                                        None),
        "OpenES, policy rollout, 8 devices": (openes, _policy_return, openes.init(jax.random.key(0), policy),
                                              es.make_mesh(DEVICES)),
        "CMAES, 10-D sphere, 1 device": (cmaes, lambda x, key: jnp.sum(x * x), cmaes.init(jax.random.key(0), jnp.ones(10)),
                                         None),
    }


def compile_seconds(round_: int) -> dict[str, float]:
    """Seconds to trace, lower and compile each program once, with ``20 + round_`` generations."""
    import jax

    import es

    times = {}
    for index, (name, (strategy, fitness_fn, state, mesh)) in enumerate(programs().items()):
        generations = 20 + 10 * round_ + index
        start = time.perf_counter()
        jax.jit(lambda s: es.evolve(strategy, fitness_fn, s, generations, mesh=mesh)).lower(state).compile()
        times[name] = time.perf_counter() - start
    return times


STRATEGIES = ("CMAES", "SepCMAES", "SNES", "OpenES", "PGPE", "ARS")
EVOSAX = {"OpenES": "Open_ES", "SNES": "SNES", "PGPE": "PGPE", "ARS": "ARS", "SepCMAES": "Sep_CMA_ES",
          "CMAES": "CMA_ES"}
"""es's strategy names -> evosax 0.3's ``evosax.algorithms`` counterparts."""


def evosax_scan(name: str, generations: int = 20):
    """``(run, args)``: evosax's counterpart of ``name`` on a 10-D sphere (popsize 16, scale 0.3), its state
    made; ``run(*args)`` is one jitted ``lax.scan`` of ``generations`` ask, evaluate and tell steps."""
    import jax
    import jax.numpy as jnp
    import optax
    from evosax import algorithms

    params = jnp.ones(10)
    cls = getattr(algorithms, EVOSAX[name])
    if name in ("OpenES", "ARS"):
        algorithm = cls(population_size=16, solution=params, std_schedule=optax.constant_schedule(0.3))
        hyperparams = algorithm.default_params
    else:
        algorithm = cls(population_size=16, solution=params)
        hyperparams = algorithm.default_params.replace(std_init=0.3)
    state = jax.block_until_ready(algorithm.init(jax.random.key(1), params, hyperparams))
    evaluate = jax.vmap(lambda x: jnp.sum(x * x))

    @jax.jit
    def run(state, key):
        def generation(state, key):
            ask_key, tell_key = jax.random.split(key)
            population, state = algorithm.ask(ask_key, state, hyperparams)
            state, _ = algorithm.tell(tell_key, population, evaluate(population), state, hyperparams)
            return state, None
        return jax.lax.scan(generation, state, jax.random.split(key, generations))[0]

    return run, (state, jax.random.key(0))


def program_stats(library: str, name: str) -> dict[str, float]:
    """Compile ``name``'s 20-generation program of ``library`` (``"es"`` or ``"evosax"``) once: its seconds
    (trace, lower, compile), fusions and HLO instructions."""
    import jax
    import jax.numpy as jnp

    if library == "es":
        import es

        strategy = es.STRATEGIES[name](popsize=16, sigma=0.3)
        state = jax.block_until_ready(strategy.init(jax.random.key(0), jnp.ones(10)))
        run = jax.jit(lambda s: es.evolve(strategy, lambda x, key: -jnp.sum(x * x), s, 20))
        args = (state,)
    else:
        run, args = evosax_scan(name)
    start = time.perf_counter()
    text = run.lower(*args).compile().as_text()
    seconds = time.perf_counter() - start
    return {"s": seconds, "fusions": len(re.findall(r"^\s*\S+ = .* fusion\(", text, re.MULTILINE)),
            "instructions": len(re.findall(r"^\s+\S+ = ", text, re.MULTILINE))}


def stats_child(library: str, name: str) -> dict[str, float]:
    """``program_stats`` in a fresh process (no compilation cache: ``JAX_COMPILATION_CACHE_DIR`` cleared)."""
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": "", "ES_COMPILATION_CACHE": "off"}
    code = ("import json, sys; from experiments.bench.compile_time import program_stats; "
            "print(json.dumps(program_stats(sys.argv[1], sys.argv[2])))")
    out = subprocess.run([sys.executable, "-c", code, library, name], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def against_evosax(names, rounds: int) -> tuple[list[dict], str]:
    """Each strategy's program and evosax's, ``rounds`` fresh processes each, alternating: rows and a table."""
    rows, table = [], []
    for name in names:
        runs = {"es": [], "evosax": []}
        for round_ in range(rounds):
            for library in (("es", "evosax") if round_ % 2 == 0 else ("evosax", "es")):
                runs[library].append(stats_child(library, name))
            print(f"{name} round {round_}: " + json.dumps({k: v[-1] for k, v in runs.items()}), flush=True)
        median = {library: {key: statistics.median(r[key] for r in values) for key in values[0]}
                  for library, values in runs.items()}
        rows.append({"strategy": name, "evosax": EVOSAX[name], "runs": runs, "median": median})
        es_, ev = median["es"], median["evosax"]
        table.append([name, f"{es_['s']:.2f}", f"{ev['s']:.2f}", f"{es_['s'] / ev['s']:.2f}x",
                      f"{es_['fusions']:.0f}", f"{ev['fusions']:.0f}", f"{es_['instructions']:.0f}",
                      f"{ev['instructions']:.0f}"])
    header = ["strategy", "es compile s", "evosax compile s", "es / evosax", "es fusions", "evosax fusions",
              "es HLO instructions", "evosax HLO instructions"]
    return rows, markdown_table(header, table)


def child(checkout: str, round_: int) -> dict[str, float]:
    """``compile_seconds(round_)`` in a fresh process that imports es from ``checkout``."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout), "JAX_NUM_CPU_DEVICES": str(DEVICES)}
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
            "from experiments.bench.compile_time import compile_seconds; "
            "print(json.dumps(compile_seconds(int(sys.argv[2]))))")
    out = subprocess.run([sys.executable, "-c", code, os.path.abspath(checkout), str(round_)], env=env,
                         capture_output=True, text=True, check=True, cwd=os.path.abspath(checkout))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compare", metavar="DIR", help="another checkout, timed alternately with this one")
    parser.add_argument("--evosax", action="store_true", help="each strategy against its evosax counterpart")
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES),
                        help="with --evosax: which (default all six)")
    parser.add_argument("--out", default=None, help="default: results/compile_time.json (--evosax: "
                                                    "compile_time-evosax.json)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give at least 1")
    if args.evosax and args.compare:
        parser.error("--evosax and --compare: give one (another checkout, or evosax)")
    if args.evosax:
        if importlib.util.find_spec("evosax") is None:
            parser.error('--evosax: evosax is not installed; pip install -e ".[bench]"')
        rows, text = against_evosax(args.strategies, args.rounds)
        write_results(args.out or os.path.join(RESULTS, "compile_time-evosax.json"), rows, text,
                      {"rounds": args.rounds})
        return
    args.out = args.out or os.path.join(RESULTS, "compile_time.json")
    if args.compare and not os.path.isdir(os.path.join(args.compare, "es")):
        parser.error(f"--compare {args.compare}: not a checkout of this repository (no es/ in it)")
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    checkouts = {"this": here, **({"other": args.compare} if args.compare else {})}
    runs = {label: [] for label in checkouts}
    for round_ in range(args.rounds):
        order = list(checkouts) if round_ % 2 == 0 else list(checkouts)[::-1]
        for label in order:
            runs[label].append(child(checkouts[label], round_))
            print(f"round {round_} {label}: " + ", ".join(f"{k}: {v:.2f} s" for k, v in runs[label][-1].items()),
                  flush=True)
    names = list(runs["this"][0])
    medians = {label: {name: statistics.median(r[name] for r in rounds) for name in names}
               for label, rounds in runs.items()}
    header = ["program", "compile s (this)"] + (["compile s (other)", "this / other"] if args.compare else [])
    rows = [[name, f"{medians['this'][name]:.2f}"]
            + ([f"{medians['other'][name]:.2f}", f"{medians['this'][name] / medians['other'][name]:.2f}x"]
               if args.compare else []) for name in names]
    write_results(args.out, [{"checkout": label, "dir": checkouts[label], "rounds": rounds, "median": medians[label]}
                             for label, rounds in runs.items()], markdown_table(header, rows), {"rounds": args.rounds})


if __name__ == "__main__":
    main()
