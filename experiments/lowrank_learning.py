"""Does rank-1 low-rank ES still learn? Full-rank against ``es.LowRankNoise(rank=1, factored=True)`` on
CartPole-v1 and Pendulum-v1 with a 256x256 MLP policy.

    python -m experiments.lowrank_learning --env CartPole-v1 --noise full --seed 0     # one job per run
    python -m experiments.lowrank_learning --env CartPole-v1 --noise lowrank --seed 0
    python -m experiments.lowrank_learning --report                                   # the table

Settings are those of ``experiments/configs/cartpole.yaml`` and ``pendulum.yaml`` (OpenES, sigma 0.1,
Adam 0.03, popsize 128 / 256, 2 episodes per evaluation, observation normalisation) with
``hidden_sizes=(256, 256)`` (67k params); only the noise differs. Every ``--segment`` generations the
mean params are evaluated on ``--eval-episodes`` held-out episodes. The target of an environment is
500 for CartPole-v1 and, for Pendulum-v1, the full-rank run's final return of the same seed minus
``--margin`` (about one standard error of the evaluation); the report gives the generations each run
needs to reach it, and low-rank passes when it needs at most 1.5x the full-rank generations.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time
from typing import Callable

RESULTS = pathlib.Path(__file__).parent / "results" / "lowrank_learning"
SETTINGS = {  # env -> (config file, generations)
    "CartPole-v1": ("cartpole.yaml", 60),
    "Pendulum-v1": ("pendulum.yaml", 300),
}
HIDDEN = (256, 256)
TARGET_RATIO = 1.5


def run(env: str, noise: str, seed: int, generations: int, segment: int, eval_episodes: int,
        save: Callable[[dict], None] = lambda result: None) -> dict:
    import jax

    import es
    from experiments import config as config_lib

    config_file, _ = SETTINGS[env]
    config = config_lib.resolve(config_lib.load(pathlib.Path(__file__).parent / "configs" / config_file))
    config["task"]["options"] = {**config["task"]["options"], "hidden_sizes": HIDDEN}
    task, strategy = config_lib.build(config)
    if noise == "lowrank":
        strategy = dataclasses.replace(strategy, noise=es.LowRankNoise(rank=1, factored=True))
    fitness, state = config_lib.initial_state(task, strategy, seed)
    evaluate = jax.jit(task.held_out(eval_episodes).mean_return)
    eval_key = jax.random.key(10_000 + seed)  # never used in training
    mesh = es.make_mesh(1)
    curve, wall, done = [], 0.0, 0
    result = {"env": env, "noise": noise, "seed": seed, "params": es.engine.num_params(state.params),
              "popsize": strategy.popsize, "eval_episodes": eval_episodes, "generations": generations, "curve": curve}
    while done < generations:
        start = time.perf_counter()
        state, metrics = es.evolve(strategy, fitness, state, segment, mesh=mesh)
        jax.block_until_ready(state)
        wall += time.perf_counter() - start
        done += segment
        value = float(evaluate(state.params, jax.random.fold_in(eval_key, done), state.fitness_state))
        curve.append({"generation": done, "return": value, "fitness_mean": float(metrics["fitness_mean"][-1]),
                      "wall_s": wall})
        print(f"{env} {noise} seed {seed} gen {done:4d} return {value:9.2f} "
              f"population mean {curve[-1]['fitness_mean']:9.2f} {wall:7.1f} s", flush=True)
        save(result)  # after every segment: a run cut short still leaves its curve so far
    return result


def first_reaching(curve: list[dict], target: float) -> int | None:
    return next((p["generation"] for p in curve if p["return"] >= target), None)


def final(run: dict) -> str:
    """The last held-out return of a run and, in brackets, the generations it ran."""
    return f"{run['curve'][-1]['return']:.1f} ({run['curve'][-1]['generation']})"


def report(margin: float) -> str:
    from experiments.bench.common import markdown_table

    runs = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]
    by = {(r["env"], r["noise"], r["seed"]): r for r in runs}
    rows = []
    for env, noise_, seed in sorted(k for k in by if k[1] == "full"):
        full, low = by[(env, "full", seed)], by.get((env, "lowrank", seed))
        target = 500.0 - 1e-3 if env == "CartPole-v1" else full["curve"][-1]["return"] - margin
        g_full = first_reaching(full["curve"], target)
        g_low = first_reaching(low["curve"], target) if low else None
        ratio = g_low / g_full if g_full and g_low else None
        rows.append([env, seed, f"{target:.1f}", final(full), final(low) if low else "-", g_full or "never",
                     g_low or "never",
                     f"{ratio:.2f}" if ratio else "-", "yes" if ratio is not None and ratio <= TARGET_RATIO else "no"])
    return markdown_table(["env", "seed", "target", "full-rank final (gens run)", "rank-1 final (gens run)",
                           "full-rank gens to target", "rank-1 gens to target", "ratio", f"<= {TARGET_RATIO}"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", choices=list(SETTINGS))
    parser.add_argument("--noise", choices=["full", "lowrank"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--generations", type=int, default=None, help="default: 60 (CartPole), 300 (Pendulum)")
    parser.add_argument("--segment", type=int, default=5)
    parser.add_argument("--eval-episodes", type=int, default=64)
    parser.add_argument("--margin", type=float, default=10.0, help="Pendulum: target = full-rank final - margin")
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    if args.report:
        print(report(args.margin))
        return
    if not (args.env and args.noise):
        parser.error("give --env and --noise (one run), or --report")
    generations = args.generations or SETTINGS[args.env][1]
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{args.env}-{args.noise}-seed{args.seed}.json"
    run(args.env, args.noise, args.seed, generations, args.segment, args.eval_episodes,
        save=lambda result: path.write_text(json.dumps(result, indent=1)))


if __name__ == "__main__":
    main()
