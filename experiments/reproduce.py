"""Reproduce published ES returns on gymnax environments and write docs/results.md.

    python -m experiments.reproduce                                  # every config, seeds 0 1 2
    python -m experiments.reproduce experiments/configs/pendulum.yaml --seeds 0 1 2 3
    python -m experiments.reproduce experiments/configs/breakout_minatar.yaml \
        --seeds 0 --set run.islands=16 --no-save                         # a probe: 16 runs per seed, not saved
    python -m experiments.reproduce --report-only                    # re-render docs from saved runs

For each config (``experiments/configs/*.yaml``, the schema of
``python -m experiments.train``) the script trains every seed as one program
(``es.run_many``: one ``es.evolve_many`` per segment of ``run.segment``
generations; each seed's run is the one ``python -m experiments.train --set
run.seed=SEED`` makes, or with ``run.islands`` its best island's, see
``train_seeds``), evaluates each seed's mean parameters after every
segment on held-out episodes (its ``on_segment`` hook: the learning curve), and
finally evaluates them on ``--eval-episodes`` fresh episodes whose keys are
never used in training. Each run is saved as JSON under
``experiments/results/``; the report (table and PNG learning curves) is
rebuilt from those files (``experiments.results_report``).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import time
from typing import Any

import numpy as np

from experiments.results_report import (
    CURVE_EPISODES, DOCS, REFERENCE_TEST_EPISODES, RESULTS_DIR, ROOT, STRATEGY_RESULTS_DIR, load_runs,
    with_kept_sections, write_report,
)

CONFIG_DIR = ROOT / "experiments" / "configs"
EVAL_KEY_OFFSET = 1_000_003  # evaluation keys: key(EVAL_KEY_OFFSET + seed), disjoint from training keys
FINAL_EVAL_INDEX = 2**30  # the final evaluation's key: fold_in(eval key, FINAL_EVAL_INDEX)


# -------------------------------------------------------------------------- configs


def load_config(path, generations: int | None = None, strategy: str | None = None,
                overrides: list[str] = ()) -> tuple[dict, Any]:
    """``(resolved config, Experiment(task, strategy))`` of ``path``, read as ``python -m experiments.train`` reads it.

    ``overrides`` are ``--set KEY=VALUE`` values, as train takes them; ``generations`` overrides
    ``run.generations``; ``strategy`` replaces the strategy section by that strategy at its own defaults
    with the config's popsize, ``overrides`` applied (``--set 'strategy={name: SNES, popsize: P}'``). Raises
    ``ConfigError``.
    """
    from experiments import config as config_lib

    config = config_lib.with_overrides(config_lib.load(path), list(overrides))
    overrides = [] if generations is None else [f"run.generations={generations}"]
    if strategy is not None:
        overrides.append(f"strategy={{name: {strategy}, popsize: {config['strategy']['popsize']}}}")
    if overrides:
        config = config_lib.resolve(config_lib.apply_overrides(config, overrides))
    return config, config_lib.build(config)


# -------------------------------------------------------------------------- training


def train(config: dict, task, strategy, seed: int, eval_episodes: int) -> dict:
    """One seed of a resolved config and its built task and strategy: the learning curve and the final evaluation.

    ``train_seeds`` for one seed.
    """
    return train_seeds(config, task, strategy, [seed], eval_episodes)[0]


def island_seed(seed: int, island: int, islands: int) -> int:
    """The ``es.init_from_seed`` seed of island ``island`` of seed ``seed``: ``seed * islands + island``.

    Distinct for every (seed, island) of a config; with one island it is ``seed`` itself.
    """
    return seed * islands + island


def train_seeds(config: dict, task, strategy, seeds: list[int], eval_episodes: int) -> list[dict]:
    """Every seed of a resolved config, trained together as one program: learning curves and final evaluations.

    The seeds' runs are the runs of one ``es.run_many`` (one compilation,
    each device evaluating its share of every seed's population), and each
    follows ``python -m experiments.train`` with ``run.seed = seed``
    generation for generation (the same ``experiments.config.initial_state``,
    mesh and execution; ``es.evolve_many`` runs each as its own ``es.evolve``
    would: bit for bit for one seed, and for several where XLA batches their
    rollouts without rounding otherwise, docs/guides/sweeps.md). Its
    ``on_segment`` hook evaluates every seed's mean after each segment. One result per seed, in order; their
    ``wall_s`` is the time of the program that trained them all
    (``trained_with_seeds``).

    With ``run.islands = K > 1`` every seed first trains ``K`` independent
    runs (its islands, seeded ``island_seed(seed, k, K)``) for
    ``run.island_generations``, one island after another (``train_islands``); each seed
    then goes on with its island of the best mean training fitness over the
    last segment (``kept_island``; held-out episodes play no part) to
    ``run.generations``, with ``run.sigma_after_islands`` set restarted at that
    sigma (``restarted_at_sigma``). A seed's ``env_steps`` count every island's steps.
    """
    import jax

    import es
    from experiments.config import initial_state
    from experiments.train import execution, make_mesh

    configs = [{**config, "run": {**config["run"], "seed": seed}} for seed in seeds]
    run = config["run"]
    generations, segment, islands = run["generations"], run["segment"], run["islands"]
    mesh = make_mesh(config, strategy.popsize)
    fitness = task.fitness  # the returns, and a count of env steps in the state

    curve_eval = jax.jit(task.held_out(CURVE_EPISODES).mean_return)
    reference_eval = jax.jit(task.held_out(REFERENCE_TEST_EPISODES).mean_return)
    final_task = task.held_out(eval_episodes)
    eval_keys = [jax.random.key(EVAL_KEY_OFFSET + seed) for seed in seeds]
    # unused by the curve and the final evaluation
    reference_keys = [jax.random.fold_in(key, FINAL_EVAL_INDEX + 1) for key in eval_keys]
    evaluating = [0.0]  # seconds spent in on_segment, not training

    def evaluate(fn, state, k):
        return float(fn(state.params, k, state.fitness_state))

    def point(state, key, generation: int, time_s: float, metrics: dict | None, extra_steps: float = 0.0) -> dict:
        # metrics: the segment's (es.Segment.metrics); its last generation's population mean and mean sigma
        last = {name: float("nan") if metrics is None else float(metrics[name][-1]) for name in ("fitness_mean", "sigma")}
        return {"generation": generation, "env_steps": float(state.fitness_state.env_steps) + extra_steps,
                "return": evaluate(curve_eval, state, jax.random.fold_in(key, generation)),
                "wall_s": time_s - evaluating[0], **last}

    def timed(hook):
        # es.run_many has already dispatched the next segment (it pipelines): wait for it, so that what is
        # timed, and subtracted from the training time, is the evaluations alone.
        def on_segment(segments: list[es.Segment]) -> None:
            jax.block_until_ready(jax.live_arrays())
            start = time.perf_counter()
            hook(segments)
            evaluating[0] += time.perf_counter() - start
        return on_segment

    def run_all(states, num_generations, hook, strategy=strategy):
        return es.run_many([strategy] * len(states), fitness, states, num_generations, segment=segment, mesh=mesh,
                           on_segment=timed(hook), progress=False, handle_signals=False, **execution(config))

    island_info: list[dict | None] = [None] * len(seeds)
    if islands > 1:
        states, curves, island_info, phase_s = train_islands(
            config, task, strategy, seeds, eval_keys, point, run_all)
        if run["sigma_after_islands"] is not None:
            strategy, states = restarted_at_sigma(strategy, states, run["sigma_after_islands"])
    else:
        states = [initial_state(task, strategy, seed, fitness=fitness)[1] for seed in seeds]
        curves = [[point(state, key, 0, 0.0, None)] for state, key in zip(states, eval_keys)]
        phase_s = 0.0
    offset = int(states[0].generation)
    other_steps = [0.0 if info is None else info["other_islands_env_steps"] for info in island_info]

    def on_segment(segments: list[es.Segment]) -> None:
        for seed, done, curve, key, reference_key, extra in zip(
                seeds, segments, curves, eval_keys, reference_keys, other_steps):
            generation = offset + done.stop
            curve.append({
                **point(done.state, key, generation, phase_s + done.time_s, done.metrics, extra),
                "reference_test_return": evaluate(reference_eval, done.state,
                                                  jax.random.fold_in(reference_key, generation)),
            })
            print_point(seed, curve[-1])

    runs = run_all(states, generations - offset, on_segment, strategy)
    results = []
    final_rollout = jax.jit(final_task.rollout)
    for seed, run_result, curve, key, run_config, extra, info in zip(
            seeds, runs, curves, eval_keys, configs, other_steps, island_info):
        state = run_result.state
        # islands need island_generations < generations, so any generations leave some to run_all
        wall = phase_s + float(run_result.time_s[-1]) - evaluating[0] if generations else 0.0
        final_returns = np.asarray(final_rollout(state.params, jax.random.fold_in(key, FINAL_EVAL_INDEX),
                                                 state.fitness_state.obs).returns)
        result = {
            "env": task.env_id,
            "seed": seed,
            "generations": generations,
            "popsize": strategy.popsize,
            "strategy": type(strategy).__name__,
            "env_steps": float(state.fitness_state.env_steps) + extra,
            "wall_s": wall,
            "trained_with_seeds": list(seeds),
            "final_return_mean": float(np.mean(final_returns)),
            "final_return_std": float(np.std(final_returns)),
            "eval_episodes": eval_episodes,
            "best_reference_test_return": max(p["reference_test_return"] for p in curve if "reference_test_return" in p),
            "curve": curve,
            "config": run_config,
        }
        if info is not None:
            result["islands"] = info
        results.append(result)
    return results


def train_islands(config, task, strategy, seeds, eval_keys, point, run_all):
    """``run.islands`` runs per seed for ``run.island_generations``, one after another; each seed keeps its best.

    Each island is its own program (``run_all`` of one state: ``es.evolve``'s,
    so island ``k`` of seed ``s`` is ``python -m experiments.train --set
    run.seed=island_seed(s, k, K)``'s run bit for bit), not one vmapped
    program: a vmapped rollout runs until the longest episode of every island
    has ended, so the islands that have learned to play long episodes would
    hold up every other. A point's wall time counts the islands trained before
    its own.

    Returns ``(states, curves, island_info, seconds)``: per seed the kept
    island's state and curve (env steps summed over the seed's islands), a
    record of every island (``kept_island``'s score, its held-out
    curve return at the end, which was kept, the other islands' env steps)
    and the phase's seconds (every island's ``es.run`` time, evaluations included).
    """
    from experiments.config import initial_state

    islands, island_generations = config["run"]["islands"], config["run"]["island_generations"]
    starts = [initial_state(task, strategy, island_seed(seed, k, islands), fitness=task.fitness)[1]
              for seed in seeds for k in range(islands)]
    island_keys = [key for key in eval_keys for _ in range(islands)]
    curves = [[point(state, key, 0, 0.0, None)] for state, key in zip(starts, island_keys)]
    last_segment = [None] * len(starts)
    runs, seconds = [], 0.0
    for index, (start, curve, key) in enumerate(zip(starts, curves, island_keys)):
        seed, island = seeds[index // islands], index % islands

        def on_segment(segments, curve=curve, key=key, index=index, seed=seed, island=island, before=seconds) -> None:
            done = segments[0]
            curve.append(point(done.state, key, done.stop, before + done.time_s, done.metrics))
            last_segment[index] = done.metrics["fitness_mean"]
            print(f"  seed {seed} island {island} gen {done.stop:5d}  population mean "
                  f"{curve[-1]['fitness_mean']:.2f}  return {curve[-1]['return']:.2f}", flush=True)

        [run] = run_all([start], island_generations, on_segment)
        runs.append(run)
        seconds += float(run.time_s[-1])
    states, kept_curves, info = [], [], []
    for i, seed in enumerate(seeds):
        mine = range(i * islands, (i + 1) * islands)
        scores = [float(np.mean(last_segment[j])) for j in mine]
        kept = kept_island(scores, strategy.maximize)
        steps = [float(runs[j].state.fitness_state.env_steps) for j in mine]
        others = sum(steps) - steps[kept]
        for p in range(len(curves[mine[0]])):  # a point's env steps: all the seed's islands up to it
            curves[mine[kept]][p]["env_steps"] = sum(curves[j][p]["env_steps"] for j in mine)
        states.append(runs[mine[kept]].state)
        kept_curves.append(curves[mine[kept]])
        info.append({"count": islands, "generations": island_generations, "kept": kept,
                     "island_seeds": [island_seed(seed, k, islands) for k in range(islands)],
                     "training_fitness": scores, "held_out_return": [curves[j][-1]["return"] for j in mine],
                     "other_islands_env_steps": others})
        print(f"  seed {seed}: keeps island {kept} (training fitness {scores[kept]:.2f} of "
              f"{', '.join(f'{s:.2f}' for s in scores)})", flush=True)
    return states, kept_curves, info, seconds


def restarted_at_sigma(strategy, states: list, sigma: float) -> tuple[Any, list]:
    """``run.sigma_after_islands``: ``strategy`` with ``sigma``, and each state's strategy state restarted at it.

    Every strategy has a ``sigma`` (its initial scale); the states keep their
    mean, key, generation, best member and fitness state (observation
    statistics, env steps), and only ``strategy_state`` starts over, as
    ``strategy.init(key, params).strategy_state`` of the new strategy gives it (for SNES:
    every coordinate's scale at ``sigma``; for OpenES a fresh optimizer state).
    """
    restarted = dataclasses.replace(strategy, sigma=sigma)
    return restarted, [state._replace(strategy_state=restarted.init(state.key, state.params).strategy_state)
                       for state in states]


def kept_island(scores: list[float], maximize: bool = True) -> int:
    """The island kept: the best mean training fitness over the last segment (the first of ties)."""
    return int(np.argmax(scores) if maximize else np.argmin(scores))


def print_point(seed: int, point: dict) -> None:
    print(f"  seed {seed} gen {point['generation']:5d}  return {point['return']:9.2f}  "
          f"population mean {point['fitness_mean']:9.2f}  sigma {point.get('sigma', float('nan')):.4f}  "
          f"steps {point['env_steps']:.3g}  "
          f"{point['wall_s']:7.1f} s", flush=True)


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="*", help="YAML configs (default: experiments/configs/*.yaml)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-episodes", type=int, default=64)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, as python -m experiments.train --set does")
    parser.add_argument("--generations", type=int, default=None, help="override run.generations (quick checks)")
    parser.add_argument("--report-only", action="store_true", help="rebuild docs/results.md from saved runs")
    parser.add_argument("--no-save", action="store_true", help="do not save runs or write the report")
    parser.add_argument("--strategy", default=None, help="compare strategies: run the configs with this strategy "
                        "(a name in es.STRATEGIES) at its own defaults and the config's popsize, saved under "
                        "experiments/results/strategies/ for the comparison table")
    args = parser.parse_args(argv)

    from experiments.bench.common import machine_description
    from experiments.config import ConfigError
    from tasks.envs import EnvTask

    if not args.report_only:
        configs = args.configs or sorted(glob.glob(str(CONFIG_DIR / "*.yaml")))
        for path in configs:
            try:
                config, (task, strategy) = load_config(path, args.generations, args.strategy, args.overrides)
            except ConfigError as error:
                parser.error(f"{path}: {error}")
            if not isinstance(task, EnvTask):
                if args.configs:
                    parser.error(f"{path}: task {config['task']['name']!r} is not a gymnax environment")
                continue  # e.g. demo.yaml (Rastrigin): not an environment to reproduce
            print(f"{path}: {config['task']}, seeds {', '.join(map(str, args.seeds))} in one program", flush=True)
            for seed, result in zip(args.seeds, train_seeds(config, task, strategy, args.seeds, args.eval_episodes)):
                result["device"] = machine_description()
                print(f"  seed {seed}: final return {result['final_return_mean']:.2f} "
                      f"± {result['final_return_std']:.2f} over {args.eval_episodes} episodes", flush=True)
                if not args.no_save:
                    directory = RESULTS_DIR if args.strategy is None else STRATEGY_RESULTS_DIR
                    directory.mkdir(parents=True, exist_ok=True)
                    name = f"{result['env']}_seed{seed}.json"
                    if args.strategy is not None:
                        name = f"{result['env']}_{args.strategy}_seed{seed}.json"
                    with open(directory / name, "w") as f:
                        json.dump(result, f, indent=1)
    if args.no_save:
        return
    runs = load_runs()
    devices = sorted({r.get("device", "?") for rs in runs.values() for r in rs})
    report = write_report(runs, "; ".join(devices), ROOT / "experiments" / "results_notes.md",
                          load_runs(STRATEGY_RESULTS_DIR))
    (DOCS / "results.md").write_text(with_kept_sections(report, DOCS / "results.md"))
    print(f"wrote {DOCS / 'results.md'}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
