"""Host fitness on gymnasium MuJoCo envs, on 1 and 2 devices: seconds per generation, and what a change costs.

    python -m experiments.bench.host_envs                                   # Hopper and HalfCheetah, 1 and 2 devices
    python -m experiments.bench.host_envs --compare OTHER_CHECKOUT --rounds 3
    python -m experiments.bench.host_envs --envs Ant-v5 --devices 2 --generations 5

Each case is a child process (``JAX_NUM_CPU_DEVICES`` = its device count) that makes
``tasks.make("gymnasium:<env>")`` with its defaults (a linear policy, ``tasks.default_strategy``'s tuned ARS,
workers on every core), runs one generation (compiling, starting the workers), then times ``--generations``
generations in one ``es.evolve`` call: seconds per generation and env steps per second. ``--compare DIR``
runs every case from this checkout and from ``DIR`` (another checkout of the repository, e.g. ``git worktree
add /tmp/base HEAD~1``), alternating which goes first, round after round, and reports both medians and their
ratio: what a change of the host path costs, side by side on the same machine. A child that fails or times out
(an XLA abort, a hang) is reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from experiments.bench.common import markdown_table, run_command, write_results

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def child(env_id: str, devices: int, generations: int) -> dict:
    """One case in this process (its devices already set): ``{"s_per_generation", "steps_per_s"}``."""
    import jax

    import es
    import tasks

    task = tasks.make(f"gymnasium:{env_id}")
    strategy = tasks.default_strategy(task)
    state = strategy.init(jax.random.key(0), task.init_params(jax.random.key(0)), fitness=task.fitness)
    mesh = es.make_mesh(devices)
    with task.host_fitness:
        state, _ = es.evolve(strategy, task.fitness, state, 1, mesh=mesh)
        steps = float(state.fitness_state.env_steps)
        start = time.perf_counter()
        state, _ = es.evolve(strategy, task.fitness, state, generations, mesh=mesh)
        seconds = time.perf_counter() - start
    return {"s_per_generation": seconds / generations,
            "steps_per_s": (float(state.fitness_state.env_steps) - steps) / seconds}


def run_case(checkout: str, env_id: str, devices: int, generations: int, timeout: float) -> dict:
    """``child`` in a fresh process that imports es from ``checkout``, and runs there: its worker processes, which
    import the main module's path afresh, must import the same checkout."""
    code = ("import json, os, sys; os.chdir(sys.argv[1]); sys.path.insert(0, sys.argv[1]); "
            "from experiments.bench.host_envs import child; "
            "print(json.dumps(child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))")
    env = {"PYTHONPATH": os.path.abspath(checkout), "JAX_NUM_CPU_DEVICES": str(devices)}
    command = [sys.executable, "-c", code, os.path.abspath(checkout), env_id, str(devices), str(generations)]
    return run_command(command, timeout, env)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["Hopper-v5", "HalfCheetah-v5"])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--generations", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per child")
    parser.add_argument("--compare", metavar="DIR", help="another checkout, timed alternately with this one")
    parser.add_argument("--out", default=os.path.join(RESULTS, "host_envs.json"))
    args = parser.parse_args(argv)
    if args.compare and not os.path.isdir(os.path.join(args.compare, "es")):
        parser.error(f"--compare {args.compare}: not a checkout of this repository (no es/ in it)")
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    checkouts = {"this": here, **({"other": args.compare} if args.compare else {})}
    cases = [(env_id, devices) for env_id in args.envs for devices in args.devices]
    runs = {(label, case): [] for label in checkouts for case in cases}
    for round_ in range(args.rounds):
        for env_id, devices in cases:
            order = list(checkouts) if round_ % 2 == 0 else list(checkouts)[::-1]
            for label in order:
                result = run_case(checkouts[label], env_id, devices, args.generations, args.timeout)
                runs[(label, (env_id, devices))].append(result)
                print(json.dumps({"round": round_, "checkout": label, "env": env_id, "devices": devices, **result}),
                      flush=True)

    def summary(label, case) -> str:
        good = [r["s_per_generation"] for r in runs[(label, case)] if "error" not in r]
        failed = len(runs[(label, case)]) - len(good)
        text = f"{statistics.median(good):.3f}" if good else "-"
        return text + (f" ({failed} failed)" if failed else "")

    rows = []
    for case in cases:
        row = [case[0], str(case[1]), summary("this", case)]
        if args.compare:
            row.append(summary("other", case))
            this = [r["s_per_generation"] for r in runs[("this", case)] if "error" not in r]
            other = [r["s_per_generation"] for r in runs[("other", case)] if "error" not in r]
            row.append(f"{statistics.median(this) / statistics.median(other):.2f}x" if this and other else "-")
        steps = [r["steps_per_s"] for r in runs[("this", case)] if "error" not in r]
        row.append(f"{statistics.median(steps):,.0f}" if steps else "-")
        rows.append(row)
    header = ["env", "devices", "s/gen (this)"] + (["s/gen (other)", "this / other"] if args.compare else [])
    header.append("env steps/s (this)")
    write_results(args.out, [{"checkout": label, "env": case[0], "devices": case[1], "runs": results}
                             for (label, case), results in runs.items()],
                  markdown_table(header, rows), {"generations": args.generations, "rounds": args.rounds})


if __name__ == "__main__":
    main()
