"""Do the defaults learn? ``tasks.make(env_id)`` with no options and ``tasks.default_strategy(task, name)``.

    python -m experiments.check_defaults                                   # recommended strategy, classic control
    python -m experiments.check_defaults --strategies SNES PGPE --envs CartPole-v1 Pendulum-v1 --seeds 0 1 2
    python -m experiments.check_defaults --strategies ARS --out /tmp/ars.json          # one job per strategy
    python -m experiments.check_defaults --report /tmp/*.json                          # merge jobs into one table

Every ``--every`` generations the mean policy is evaluated on 32 held-out
episodes (keys never used in training). Reported per strategy, environment
and seed: the first generation whose held-out return reaches the target
(``TARGETS``: 500 on CartPole-v1, better than -200 on Pendulum-v1), the wall
time of the training up to it (``es.evolve`` calls, compilation included,
evaluations excluded), and the held-out return at the end of the run
(``GENERATIONS`` per environment, or ``--generations``). Runs start as
``python -m experiments.train`` starts them (``es.init_from_seed``).
"""

from __future__ import annotations

import argparse
import json
import time

CLASSIC_CONTROL = ["CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0"]
TARGETS = {"CartPole-v1": 500.0, "Pendulum-v1": -200.0}
"""Held-out return a default must reach (CartPole: every episode at its 500-step limit; Pendulum: > -200)."""
GENERATIONS = {"CartPole-v1": 100, "Pendulum-v1": 300}
DEFAULT_GENERATIONS = 200
HELD_OUT_EPISODES = 32


def reached(env_id: str, value: float) -> bool:
    """Whether a held-out return meets ``env_id``'s target (never, for environments without one)."""
    target = TARGETS.get(env_id)
    if target is None:
        return False
    return value >= target if env_id == "CartPole-v1" else value > target


def check(env_id: str, strategy_name: str | None, seed: int, generations: int, every: int, strategy=None) -> dict:
    """Train ``tasks.default_strategy(task, strategy_name)`` (or ``strategy``) on ``env_id``; evaluate every ``every``."""
    import jax

    import es
    import tasks
    from experiments.config import initial_state

    task = tasks.make(env_id)
    strategy = strategy or tasks.default_strategy(task, strategy_name)
    fitness, state = initial_state(task, strategy, seed)  # as python -m experiments.train starts
    evaluate = jax.jit(task.held_out(HELD_OUT_EPISODES).mean_return)
    held_out = jax.random.key(10**6 + seed)
    curve = [(0, float(evaluate(state.params, held_out, state.fitness_state)))]
    training_s, first, first_s = 0.0, None, None
    while curve[-1][0] < generations:
        step = min(every, generations - curve[-1][0])
        start = time.perf_counter()
        state, _ = es.evolve(strategy, fitness, state, step)
        jax.block_until_ready(state)
        training_s += time.perf_counter() - start
        curve.append((curve[-1][0] + step, float(evaluate(state.params, held_out, state.fitness_state))))
        if first is None and reached(env_id, curve[-1][1]):
            first, first_s = curve[-1][0], training_s
    return {"env": env_id, "strategy": type(strategy).__name__, "seed": seed, "popsize": strategy.popsize,
            "generations": generations, "every": every, "target": TARGETS.get(env_id), "reached_at": first,
            "reached_s": first_s, "final": curve[-1][1], "training_s": training_s, "curve": curve,
            "described": strategy.describe()}


def table(records: list[dict]) -> str:
    from experiments.bench.common import markdown_table

    rows = []
    for r in records:
        hit = "-" if r["target"] is None else (
            f"{r['reached_at']}" if r["reached_at"] is not None else f"not in {r['generations']}")
        rows.append([r["strategy"], f"`{r['env']}`", r["seed"], r["popsize"], f"{r['curve'][0][1]:.1f}", hit,
                     "-" if r["reached_s"] is None else f"{r['reached_s']:.0f} s", f"{r['final']:.1f}",
                     r["generations"], f"{r['training_s']:.0f} s"])
    return markdown_table(["strategy", "environment", "seed", "popsize", "generation 0", "target reached at",
                           "wall time to target", "final return", "generations", "total wall time"], rows)


def summary(records: list[dict]) -> str:
    """Per strategy and environment: seeds that reached the target, median generations and wall time."""
    from experiments.bench.common import markdown_table, median

    rows = []
    for key in dict.fromkeys((r["strategy"], r["env"]) for r in records):
        mine = [r for r in records if (r["strategy"], r["env"]) == key]
        hits = [r for r in mine if r["reached_at"] is not None]
        gens = f"{median([r['reached_at'] for r in hits]):.0f}" if hits else "-"
        slowest = f"{max(r['reached_at'] for r in hits)}" if len(hits) == len(mine) else "-"
        seconds = f"{median([r['reached_s'] for r in hits]):.0f} s" if hits else "-"
        reaching = f"{len(hits)} / {len(mine)}" if mine[0]["target"] is not None else "(no target)"
        rows.append([key[0], f"`{key[1]}`", reaching, gens, slowest, seconds,
                     " / ".join(f"{r['final']:.0f}" for r in mine)])
    return markdown_table(["strategy", "environment", "seeds reaching the target", "median generations",
                           "slowest seed", "median wall time", "final return per seed"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=None, help="default: classic control (with --strategies: "
                        "CartPole-v1 and Pendulum-v1)")
    parser.add_argument("--strategies", nargs="+", default=None, help="es.STRATEGIES names (default: the recommended)")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="default 0 (with --strategies: 0 1 2)")
    parser.add_argument("--generations", type=int, default=None, help="default per environment (GENERATIONS)")
    parser.add_argument("--every", type=int, default=10, help="generations between held-out evaluations")
    parser.add_argument("--out", default=None, help="write the records as JSON")
    parser.add_argument("--report", nargs="+", default=None, metavar="JSON", help="merge JSON files; run nothing")
    args = parser.parse_args()

    if args.report:
        records = [r for path in args.report for r in json.load(open(path))["records"]]
    else:
        named = args.strategies is not None
        envs = args.envs or (list(TARGETS) if named else CLASSIC_CONTROL)
        seeds = args.seeds or ([0, 1, 2] if named else [0])
        records = []
        for name in args.strategies or [None]:
            for env_id in envs:
                for seed in seeds:
                    generations = args.generations or GENERATIONS.get(env_id, DEFAULT_GENERATIONS)
                    records.append(check(env_id, name, seed, generations, args.every))
                    r = records[-1]
                    print(f"{r['strategy']} {env_id} seed {seed}: reached at {r['reached_at']} "
                          f"({r['reached_s'] and round(r['reached_s'])} s), final {r['final']:.1f}, "
                          f"{r['training_s']:.0f} s; curve {[round(v) for _, v in r['curve']]}", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"records": records}, f, indent=1)
    print()
    print(table(records))
    print()
    print(summary(records))


if __name__ == "__main__":
    main()
