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

GENERATIONS = {"Hopper-v5": 300, "HalfCheetah-v5": 60, "Walker2d-v5": 400, "Ant-v5": 400}  # the documented budgets
TARGETS = {"Hopper-v5": 2000.0, "HalfCheetah-v5": 3000.0, "Walker2d-v5": 3000.0, "Ant-v5": 2000.0}
# ARS with linear policies in rl-baselines3-zoo (its benchmark table): (return, env steps).
REFERENCES = {"Hopper-v5": (3344.0, 7_000_000), "HalfCheetah-v5": (4815.0, 12_000_000),
              "Walker2d-v5": (2994.0, 75_000_000), "Ant-v5": (2334.0, 75_000_000)}
# Mania et al. 2018, table 1: (reward threshold, average episodes ARS V2-t took to reach it) on the v1 envs.
THRESHOLDS = {"Walker2d-v5": (4390.0, 24_000), "Ant-v5": (3580.0, 20_800)}
EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 1_000_003  # held-out episodes: key(EVAL_SEED_OFFSET + seed), disjoint from training keys
SEGMENT = 10  # generations per es.evolve call (a curve point and a check of the wall-time limit after each)
SEGMENTS: dict[str, int] = {"Walker2d-v5": 2, "Ant-v5": 2}
# every 50 generations (or the env's CURVE_EVERY, a multiple of its segment): the mean policy on 3 held-out
# episodes (in the wall time)
DEFAULT_CURVE_EVERY, CURVE_EPISODES = 50, 3
CURVE_EVERY: dict[str, int] = {"Walker2d-v5": 10, "Ant-v5": 10}
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


def run(env_id: str, seed: int, generations: int, max_minutes: float, num_workers: int | None,
        strategy_name: str | None = None, strategy_args: dict | None = None, task_args: dict | None = None,
        save_params: Path | None = None) -> dict:
    """Train one seed and evaluate it; ``strategy_name``, ``strategy_args`` and ``task_args`` are for probes
    (another strategy's default, constructor arguments replaced, ``tasks.make`` options); ``save_params`` writes
    the final mean and observation statistics there (``.npz``)."""
    import dataclasses

    import jax

    import es
    import tasks

    raw = raw_step_rate(env_id)
    task = tasks.make(f"gymnasium:{env_id}", num_workers=num_workers, **(task_args or {}))
    strategy = dataclasses.replace(tasks.default_strategy(task, strategy_name), **(strategy_args or {}))
    segment, curve_every = SEGMENTS.get(env_id, SEGMENT), CURVE_EVERY.get(env_id, DEFAULT_CURVE_EVERY)
    state = strategy.init(jax.random.key(seed), task.init_params(jax.random.key(seed)), fitness=task.fitness)
    curve_task = task.held_out(CURVE_EPISODES)
    curve = []
    start = time.perf_counter()
    stopped_by_time = False
    while int(state.generation) < generations:
        length = min(segment, generations - int(state.generation))
        state, metrics = es.evolve(strategy, task.fitness, state, length)
        elapsed = time.perf_counter() - start
        steps = float(state.fitness_state.env_steps)
        curve.append({"generation": int(state.generation), "env_steps": steps, "time_s": elapsed,
                      "fitness_mean": float(np.asarray(metrics["fitness_mean"])[-1]),
                      "fitness_max": float(np.asarray(metrics["fitness_max"])[-1])})
        if int(state.generation) % curve_every == 0:  # a short held-out check of the mean policy
            curve[-1]["curve_return"] = curve_task.mean_return(
                state.params, jax.random.fold_in(jax.random.key(EVAL_SEED_OFFSET + seed), int(state.generation)),
                state.fitness_state)
        print(json.dumps(curve[-1]), flush=True)
        if elapsed > 60 * max_minutes:
            stopped_by_time = True
            break
    train_s = time.perf_counter() - start
    task.host_fitness.close()
    if save_params is not None:
        leaves = {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(x)
                  for path, x in jax.tree_util.tree_leaves_with_path(state.params)}
        obs = state.fitness_state.obs
        np.savez(save_params, **leaves, **({} if obs is None else {f"obs/{k}": np.asarray(v)
                                                                   for k, v in obs._asdict().items()}))
    held_out = task.held_out(EVAL_EPISODES)
    eval_return = held_out.mean_return(state.params, jax.random.key(EVAL_SEED_OFFSET + seed), state.fitness_state)
    return {
        "env_id": env_id,
        "seed": seed,
        "strategy": strategy.describe(),
        "task": {"policy": "linear", "obs_norm": task.obs_norm, "reward_offset": task.reward_offset,
                 "num_episodes": task.num_episodes, "max_steps": task.max_steps,
                 "training_steps": task.training_steps, "common_random_numbers": task.common_random_numbers,
                 "num_workers": task.host_fitness.num_workers, **({"options": task_args} if task_args else {})},
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


def _results(env_id: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(RESULTS_DIR.glob(f"{env_id}_seed*.json"))]


def _first_at(result: dict, value: float) -> str:
    """Env steps (millions) at the first curve check whose return reached ``value``, or "not reached"."""
    for point in result["curve"]:
        if point.get("curve_return", -np.inf) >= value:
            return f"{point['env_steps'] / 1e6:.2f}M"
    return "not reached"


def plot_curves(env_id: str, results: list[dict]) -> str:
    """docs/img/gymnasium-<env>.png: each seed's curve checks against generations and env steps; its file name."""
    from experiments.results_report import plot

    runs = [{"seed": r["seed"], "strategy": r["strategy"]["name"],
             "curve": [{"generation": p["generation"], "env_steps": p["env_steps"], "return": p["curve_return"]}
                       for p in r["curve"] if "curve_return" in p]} for r in results]
    lines = {f"target {TARGETS[env_id]:,.0f}": TARGETS[env_id]}
    if env_id in THRESHOLDS:
        lines[f"ARS threshold {THRESHOLDS[env_id][0]:,.0f} (Mania et al.)"] = THRESHOLDS[env_id][0]
    reference = REFERENCES[env_id]
    lines[f"rl-zoo ARS {reference[0]:,.0f} at {reference[1] / 1e6:g}M"] = reference[0]
    name = f"gymnasium-{env_id}.png"
    plot(env_id, runs, RESULTS_PAGE.parent / "img" / name, lines, CURVE_EPISODES)
    return name


def report(plots: bool = True) -> str:
    """The markdown section: one row per env, one per seed, steps to the thresholds, the learning curves."""
    rows, seeds, thresholds, checks, figures = [], [], [], [], []
    for env_id in GENERATIONS:
        results = _results(env_id)
        if not results:
            continue
        returns = np.array([r["eval_return"] for r in results])
        steps = np.array([r["env_steps"] for r in results])
        minutes = np.array([r["train_s"] for r in results]) / 60
        ours = np.array([r["steps_per_s"] for r in results])
        raw = np.array([r["raw_steps_per_s"] for r in results])
        reference, reference_steps = REFERENCES[env_id]
        verdict = "met" if returns.min() >= TARGETS[env_id] else "NOT met"
        if any(r["stopped_by_time"] for r in results):
            verdict += " (a seed stopped at the time limit)"
        rows.append(
            f"| {env_id} | {len(results)} | {returns.mean():,.0f} ± {returns.std():,.0f} "
            f"({', '.join(f'{r:,.0f}' for r in returns)}) | ≥ {TARGETS[env_id]:,.0f}: {verdict} | "
            f"{steps.mean() / 1e6:.2f}M | {minutes.mean():.0f} min (max {minutes.max():.0f}) | "
            f"{ours.mean():,.0f} | {raw.mean():,.0f} | {reference:,.0f} at {reference_steps / 1e6:g}M |"
        )
        for r in results:
            seeds.append(f"| {env_id} | {r['seed']} | {r['eval_return']:,.0f} | {r['generations']} | "
                         f"{r['env_steps'] / 1e6:.2f}M | {r['train_s'] / 60:.1f} min | "
                         f"{'55-minute limit' if r['stopped_by_time'] else 'generations'} |")
        if env_id in THRESHOLDS:
            threshold, episodes = THRESHOLDS[env_id]
            thresholds.append(
                f"| {env_id} | {threshold:,.0f} | {episodes:,} episodes | "
                f"{', '.join(_first_at(r, threshold) for r in results)} | "
                f"{', '.join(_first_at(r, TARGETS[env_id]) for r in results)} |")
        points = {}
        for result in results:
            for point in result["curve"]:
                if "curve_return" in point and point["generation"] % DEFAULT_CURVE_EVERY == 0:
                    points.setdefault(point["generation"], []).append(point["curve_return"])
        if points:
            checks.append(f"- {env_id}: " + ", ".join(
                f"{np.mean(v):,.0f} at generation {g}" for g, v in sorted(points.items())))
        if plots:
            figures += [f"![{env_id}](img/{plot_curves(env_id, results)})", ""]
    first = json.loads(next(RESULTS_DIR.glob("*.json")).read_text()) if rows else None
    lines = [
        BEGIN,
        "## gymnasium MuJoCo: ARS with linear policies (host fitness)",
        "",
        "Generated by `python -m experiments.gymnasium_results report` from "
        "`experiments/results/gymnasium/*.json`; each seed ran as its own job "
        "(`flock /tmp/es-heavy.lock timeout 4000 python -m experiments.gymnasium_results run <env> --seed <k>`; "
        "Walker2d and Ant with `--num-workers 1`, two or three seeds side by side) on this project's "
        "2-core CPU, shared with other jobs: wall times are inflated by that sharing (compare our steps/s with the "
        "raw rate measured at the start of the same job).",
        "",
        "Setup: `tasks.make(\"gymnasium:<env>\")` (linear policy, observation normalisation, the survival bonus "
        "subtracted in training for Hopper, Walker2d and Ant as ARS does) and `tasks.default_strategy(task)`: ARS "
        "V2-t with Mania et al.'s hyperparameters (table 9; Hopper: 8 directions, top 4, step 0.01, noise 0.025; "
        "HalfCheetah: 32 directions, top 4, step 0.02, noise 0.03; Walker2d: 40 directions, top 30, step 0.03, "
        "noise 0.025; Ant: 60 directions, top 20, step 0.015, noise 0.025). Ant's task trains on 250-step "
        "episodes with common random numbers (every member of a generation starts from the same state; "
        "`tasks.gym.TRAINING_DEFAULTS`, tuned here: docs/tasks.md). The fitness is an `es.HostFitness` "
        f"({first['task']['num_workers'] if first else 2} worker processes for Hopper and HalfCheetah, one for "
        "Walker2d and Ant). **Return** is the mean return of the final mean "
        f"policy on {EVAL_EPISODES} held-out episodes of 1,000 steps at most (seeds never used in training, the "
        "env's own reward), per seed in brackets. **Env steps** and **wall time** are the training's (mean over "
        "seeds). **Our steps/s** counts every env step of the run (all workers, ES update and evaluation overheads "
        "included); **raw steps/s** is gymnasium's own step rate with random actions on one core, measured at "
        "the start of the same job. Budgets: Hopper-v5 300 and HalfCheetah-v5 60 generations (`GENERATIONS` in the "
        "script); Walker2d-v5 and Ant-v5 train until 55 minutes of wall time (at most "
        f"{GENERATIONS['Walker2d-v5']} and {GENERATIONS['Ant-v5']} generations), so their env steps depend on the "
        "machine's load; each seed's generations are listed below.",
        "",
        "| env | seeds | return (held out) | target | env steps | wall time | our steps/s | raw steps/s (1 core) "
        "| rl-zoo ARS |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "Each seed (training wall time; the held-out evaluation after it took a few seconds more):",
        "",
        "| env | seed | return (held out) | generations | env steps | training wall time | stopped by |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *seeds,
        "",
        "Steps to ARS's published thresholds (Mania et al. 2018, table 1: the reward thresholds of their "
        "comparison and the average number of episodes ARS V2-t took to reach them on the v1 envs; an episode "
        "is at most 1,000 steps; figures not re-checked against the paper text in this session) against "
        f"ours: the env steps at the first {CURVE_EPISODES}-episode check of the mean policy that reached the "
        "threshold, and the target, per seed (a check every "
        f"{CURVE_EVERY['Walker2d-v5']} generations, so a coarse upper bound):",
        "",
        "| env | ARS threshold | ARS V2-t to threshold | ours to threshold | ours to target |",
        "| --- | --- | --- | --- | --- |",
        *thresholds,
        "",
        f"The mean policy on {CURVE_EPISODES} held-out episodes during training (mean over seeds), every "
        f"{DEFAULT_CURVE_EVERY} generations:",
        "",
        *checks,
        "",
        f"Learning curves (the same {CURVE_EPISODES}-episode checks, every {DEFAULT_CURVE_EVERY} generations for "
        f"Hopper and HalfCheetah and every {CURVE_EVERY['Walker2d-v5']} for Walker2d and Ant), against generations "
        "and env steps:",
        "",
        *figures,
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
    one.add_argument("--strategy", default=None, help="probes: another strategy's default (tasks.default_strategy)")
    one.add_argument("--strategy-args", type=json.loads, default=None,
                     help='probes: JSON of constructor arguments to replace, e.g. \'{"popsize": 120, "top_k": 20}\'')
    one.add_argument("--save-params", type=Path, default=None, help="probes: write the final mean here (.npz)")
    one.add_argument("--task-args", type=json.loads, default=None,
                     help='probes: JSON of tasks.make options, e.g. \'{"reward_offset": 0.0}\'')
    sub.add_parser("report", help="rewrite the gymnasium section of docs/results.md")
    args = parser.parse_args(argv)
    if args.command == "report":
        write_report()
        print(report())
        return
    generations = args.generations or GENERATIONS[args.env_id]
    result = run(args.env_id, args.seed, generations, args.max_minutes, args.num_workers,
                 args.strategy, args.strategy_args, args.task_args, args.save_params)
    out = args.out or RESULTS_DIR / f"{args.env_id}_seed{args.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}))


if __name__ == "__main__":
    main()
