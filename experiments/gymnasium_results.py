"""ARS on gymnasium MuJoCo tasks (host fitness in worker processes), and its section of docs/results.md.

    python -m experiments.gymnasium_results run Hopper-v5 --seed 0        # one seed: a JSON result
    python -m experiments.gymnasium_results report                        # the docs/results.md section

Each run trains ``tasks.default_strategy(task)`` (ARS V2-t with a linear
policy, Mania et al. 2018's hyperparameters) on ``tasks.make("gymnasium:<env
id>")`` with ``es.evolve`` in segments, for ``--generations`` generations (the
documented budget of ``GENERATIONS``) or until ``--max-minutes`` of wall time,
then evaluates the final mean policy on ``EVAL_EPISODES`` held-out episodes
(seeds never used in training, the env's own reward). Before training it
measures gymnasium's raw step rate with random actions in this process, so
the result compares our env steps/s (all workers) with the raw rate of one core
on the same machine at the same time. Results go to
``experiments/results/gymnasium/<env id>_seed<k>.json``; ``report`` rewrites
the part of docs/results.md between the ``gymnasium results`` markers.

Run each seed as its own job on a shared machine:
``flock /tmp/es-heavy.lock timeout 4000 python -m experiments.gymnasium_results run Hopper-v5 --seed 0``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "experiments" / "results" / "gymnasium"
RESULTS_PAGE = ROOT / "docs" / "results.md"
BEGIN, END = "<!-- gymnasium results: begin -->", "<!-- gymnasium results: end -->"

GENERATIONS = {"Hopper-v5": 300, "HalfCheetah-v5": 60}  # the documented budgets
TARGETS = {"Hopper-v5": 2000.0, "HalfCheetah-v5": 3000.0}
# ARS with linear policies in rl-baselines3-zoo (its benchmark table): (return, env steps).
REFERENCES = {"Hopper-v5": (3344.0, 7_000_000), "HalfCheetah-v5": (4815.0, 12_000_000)}
EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 1_000_003  # held-out episodes: key(EVAL_SEED_OFFSET + seed), disjoint from training keys
SEGMENT = 10
CURVE_EVERY, CURVE_EPISODES = 50, 3  # every 50 generations: the mean policy on 3 held-out episodes (in the wall time)
RAW_STEPS = 5000


def raw_step_rate(env_id: str, steps: int = RAW_STEPS) -> float:
    """gymnasium's steps/s with random actions on one core (made like the task's env, reset on episode end)."""
    import gymnasium

    env = gymnasium.make(env_id, disable_env_checker=True)
    env.reset(seed=0)
    env.action_space.seed(0)
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    return steps / (time.perf_counter() - start)


def run(env_id: str, seed: int, generations: int, max_minutes: float, num_workers: int | None) -> dict:
    import jax

    import es
    import tasks

    raw = raw_step_rate(env_id)
    task = tasks.make(f"gymnasium:{env_id}", num_workers=num_workers)
    strategy = tasks.default_strategy(task)
    state = strategy.init(jax.random.key(seed), task.init_params(jax.random.key(seed)), fitness=task.fitness)
    curve_task = task.held_out(CURVE_EPISODES)
    curve = []
    start = time.perf_counter()
    stopped_by_time = False
    while int(state.generation) < generations:
        length = min(SEGMENT, generations - int(state.generation))
        state, metrics = es.evolve(strategy, task.fitness, state, length)
        elapsed = time.perf_counter() - start
        steps = float(state.fitness_state.env_steps)
        curve.append({"generation": int(state.generation), "env_steps": steps, "time_s": elapsed,
                      "fitness_mean": float(np.asarray(metrics["fitness_mean"])[-1]),
                      "fitness_max": float(np.asarray(metrics["fitness_max"])[-1])})
        if int(state.generation) % CURVE_EVERY == 0:  # a short held-out check of the mean policy
            curve[-1]["curve_return"] = curve_task.mean_return(
                state.params, jax.random.fold_in(jax.random.key(EVAL_SEED_OFFSET + seed), int(state.generation)),
                state.fitness_state)
        print(json.dumps(curve[-1]), flush=True)
        if elapsed > 60 * max_minutes:
            stopped_by_time = True
            break
    train_s = time.perf_counter() - start
    task.host_fitness.close()
    held_out = task.held_out(EVAL_EPISODES)
    eval_return = held_out.mean_return(state.params, jax.random.key(EVAL_SEED_OFFSET + seed), state.fitness_state)
    return {
        "env_id": env_id,
        "seed": seed,
        "strategy": strategy.describe(),
        "task": {"policy": "linear", "obs_norm": task.obs_norm, "reward_offset": task.reward_offset,
                 "num_episodes": task.num_episodes, "max_steps": task.max_steps,
                 "num_workers": task.host_fitness.num_workers},
        "generations": int(state.generation),
        "stopped_by_time": stopped_by_time,
        "env_steps": float(state.fitness_state.env_steps),
        "train_s": train_s,
        "steps_per_s": float(state.fitness_state.env_steps) / train_s,
        "raw_steps_per_s": raw,
        "eval_episodes": EVAL_EPISODES,
        "eval_return": eval_return,
        "curve": curve,
    }


def report() -> str:
    """The markdown section: one row per env, the seeds' held-out returns and the throughput."""
    rows = []
    for env_id in GENERATIONS:
        results = [json.loads(p.read_text()) for p in sorted(RESULTS_DIR.glob(f"{env_id}_seed*.json"))]
        if not results:
            continue
        returns = np.array([r["eval_return"] for r in results])
        steps = np.array([r["env_steps"] for r in results])
        hours = np.array([r["train_s"] for r in results]) / 60
        ours = np.array([r["steps_per_s"] for r in results])
        raw = np.array([r["raw_steps_per_s"] for r in results])
        reference, reference_steps = REFERENCES[env_id]
        verdict = "met" if returns.min() >= TARGETS[env_id] else "NOT met"
        if any(r["stopped_by_time"] for r in results):
            verdict += " (a seed stopped at the time limit)"
        rows.append(
            f"| {env_id} | {len(results)} | {returns.mean():,.0f} ± {returns.std():,.0f} "
            f"({', '.join(f'{r:,.0f}' for r in returns)}) | ≥ {TARGETS[env_id]:,.0f}: {verdict} | "
            f"{steps.mean() / 1e6:.2f}M | {hours.mean():.0f} min (max {hours.max():.0f}) | "
            f"{ours.mean():,.0f} | {raw.mean():,.0f} | {reference:,.0f} at {reference_steps / 1e6:g}M |"
        )
    checks = []
    for env_id in GENERATIONS:
        results = [json.loads(p.read_text()) for p in sorted(RESULTS_DIR.glob(f"{env_id}_seed*.json"))]
        points = {}
        for result in results:
            for point in result["curve"]:
                if "curve_return" in point:
                    points.setdefault(point["generation"], []).append(point["curve_return"])
        if points:
            checks.append(f"- {env_id}: " + ", ".join(
                f"{np.mean(v):,.0f} at generation {g}" for g, v in sorted(points.items())))
    first = json.loads(next(RESULTS_DIR.glob("*.json")).read_text()) if rows else None
    lines = [
        BEGIN,
        "## gymnasium MuJoCo: ARS with linear policies (host fitness)",
        "",
        "Generated by `python -m experiments.gymnasium_results report` from "
        "`experiments/results/gymnasium/*.json`; each seed ran as its own job "
        "(`flock /tmp/es-heavy.lock timeout 4000 python -m experiments.gymnasium_results run <env> --seed <k>`) "
        "on this project's 2-core CPU, shared with other jobs.",
        "",
        "Setup: `tasks.make(\"gymnasium:<env>\")` (linear policy, observation normalisation, the survival bonus "
        "subtracted in training for Hopper as ARS does) and `tasks.default_strategy(task)`: ARS V2-t with Mania et "
        "al.'s hyperparameters (Hopper: 8 directions, top 4, step 0.01, noise 0.025; HalfCheetah: 32 directions, "
        "top 4, step 0.02, noise 0.03). The fitness is an `es.HostFitness` with one worker process per core "
        f"({first['task']['num_workers'] if first else 2} here). **Return** is the mean return of the final mean "
        f"policy on {EVAL_EPISODES} held-out episodes (seeds never used in training, the env's own reward), per "
        "seed in brackets. **Env steps** and **wall time** are the training's (mean over seeds). "
        "**Our steps/s** counts every env step of the run (all workers, ES update and evaluation overheads "
        "included); **raw steps/s** is gymnasium's own step rate with random actions on one core, measured at "
        "the start of the same job. Budgets (`GENERATIONS` in the script): "
        + ", ".join(f"{env} {n} generations" for env, n in GENERATIONS.items())
        + "; each job may stop earlier after 55 minutes (none did unless the table says so).",
        "",
        "| env | seeds | return (held out) | target | env steps | wall time | our steps/s | raw steps/s (1 core) "
        "| rl-zoo ARS |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "The mean policy on 3 held-out episodes during training (mean over seeds), every 50 generations:",
        "",
        *checks,
        END,
    ]
    return "\n".join(lines)


def write_report() -> None:
    text = RESULTS_PAGE.read_text()
    section = report()
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS_PAGE.write_text(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run", help="train and evaluate one seed")
    one.add_argument("env_id", choices=sorted(GENERATIONS))
    one.add_argument("--seed", type=int, default=0)
    one.add_argument("--generations", type=int, default=None, help="default: the documented budget")
    one.add_argument("--max-minutes", type=float, default=55.0, help="stop training after this much wall time")
    one.add_argument("--num-workers", type=int, default=None, help="default: every core this process may use")
    one.add_argument("--out", type=Path, default=None, help="default: experiments/results/gymnasium/")
    sub.add_parser("report", help="rewrite the gymnasium section of docs/results.md")
    args = parser.parse_args(argv)
    if args.command == "report":
        write_report()
        print(report())
        return
    generations = args.generations or GENERATIONS[args.env_id]
    result = run(args.env_id, args.seed, generations, args.max_minutes, args.num_workers)
    out = args.out or RESULTS_DIR / f"{args.env_id}_seed{args.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}))


if __name__ == "__main__":
    main()
