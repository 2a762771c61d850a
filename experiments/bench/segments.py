"""What running in segments costs: ``es.run`` (segments of K, progress bar, log, checkpoints) vs one ``es.evolve``.

    python -m experiments.bench.segments                                   # CartPole-v1, 200 generations, K=50
    python -m experiments.bench.segments --task rastrigin --option dim=1000

Both are compiled before timing; the timed runs alternate (the order flips
every round) and the medians are compared. ``es.run`` writes a fresh run
directory each time (metrics.jsonl, an orbax checkpoint per segment,
params.npz) and draws its progress bar (to /dev/null). Target: at most 5%
over a single ``evolve`` call with K=50 on CartPole.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile

from experiments.bench.common import machine_description, markdown_table, median, timed
from experiments.devices import emulate_cpu_devices

TARGET_OVERHEAD = 0.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="CartPole-v1", help="a name from tasks.names()")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="task option (YAML value), e.g. dim=1000 or num_episodes=4")
    parser.add_argument("--popsize", type=int, default=256)
    parser.add_argument("--generations", type=int, default=200)
    parser.add_argument("--segment", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-devices", type=int, default=None, help="default: all local devices")
    args = parser.parse_args()
    emulate_cpu_devices()

    import jax
    import optax

    import es
    import tasks
    from experiments import config as config_lib

    options = {}
    for option in args.option:
        key, _, text = option.partition("=")
        options[key] = config_lib.parse_yaml(text, f"--option {key}")
    task = tasks.make(args.task, **options)
    strategy = es.OpenES(popsize=args.popsize, sigma=0.05, optimizer=optax.adam(0.01))
    fitness, state = config_lib.initial_state(task, strategy, seed=0)
    mesh = es.make_mesh(args.num_devices)
    workdir = tempfile.mkdtemp(prefix="es-bench-segments-")

    def single_evolve():
        jax.block_until_ready(es.evolve(strategy, fitness, state, args.generations, mesh))

    def segmented_run():
        run_dir = os.path.join(workdir, "run")
        shutil.rmtree(run_dir, ignore_errors=True)
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
            result = es.run(strategy, fitness, state, args.generations, run_dir=run_dir, segment=args.segment,
                            mesh=mesh, description=args.task)
        jax.block_until_ready(result.state)

    def once(fn):
        return timed(fn, 1)[0]

    compile_evolve, compile_run = once(single_evolve), once(segmented_run)
    times = {"evolve": [], "run": []}
    for round_ in range(args.repeats):
        order = [("evolve", single_evolve), ("run", segmented_run)]
        for name, fn in order if round_ % 2 == 0 else order[::-1]:
            times[name].append(once(fn))
    shutil.rmtree(workdir, ignore_errors=True)

    evolve_s, run_s = median(times["evolve"]), median(times["run"])
    overhead = run_s / evolve_s - 1
    print(f"{machine_description()}; {mesh.size} device(s)")
    print(f"task {args.task} {options}, popsize {args.popsize}, {args.generations} generations, "
          f"segment {args.segment}, {args.repeats} alternating repeats (first call incl. compile: "
          f"evolve {compile_evolve:.2f} s, run {compile_run:.2f} s)")
    print(markdown_table(
        ["variant", "median s", "all runs s", "gen/s"],
        [
            ["one es.evolve call", f"{evolve_s:.3f}", " ".join(f"{t:.3f}" for t in times["evolve"]),
             f"{args.generations / evolve_s:.1f}"],
            [f"es.run, segments of {args.segment} (+log, checkpoints, bar)", f"{run_s:.3f}",
             " ".join(f"{t:.3f}" for t in times["run"]), f"{args.generations / run_s:.1f}"],
        ],
    ))
    verdict = "meets" if overhead <= TARGET_OVERHEAD else "MISSES"
    print(f"es.run / evolve = {run_s / evolve_s:.3f} ({overhead:+.1%}); {verdict} the <= {TARGET_OVERHEAD:.0%} target")
    print(json.dumps({"task": args.task, "options": options, "evolve_s": times["evolve"], "run_s": times["run"],
                      "median_ratio": run_s / evolve_s}))


if __name__ == "__main__":
    main()
