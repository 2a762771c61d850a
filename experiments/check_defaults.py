"""Do the defaults learn? ``tasks.make(env_id)`` with no options and ``tasks.default_strategy(task)``.

    python -m experiments.check_defaults [--generations 200] [--seed 0] [ENV_ID ...]

Prints, for each classic-control environment, the return of the mean policy
(32 held-out episodes) every quarter of the run, untuned.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

CLASSIC_CONTROL = ["CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("envs", nargs="*", default=CLASSIC_CONTROL)
    parser.add_argument("--generations", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import jax

    import es
    import tasks
    from experiments.bench.common import markdown_table
    from experiments.config import initial_state

    quarter = args.generations // 4
    rows = []
    for env_id in args.envs:
        task = tasks.make(env_id)
        strategy = tasks.default_strategy(task)
        fitness, state = initial_state(task, strategy, args.seed)  # as python -m experiments.train starts
        evaluate = jax.jit(dataclasses.replace(task, num_episodes=32).mean_return)
        held_out = jax.random.key(10**6 + args.seed)
        before = float(evaluate(state.params, held_out, state.fitness_state))
        returns, start = [], time.perf_counter()
        for _ in range(4):
            state, _ = es.evolve(strategy, fitness, state, quarter)
            returns.append(float(evaluate(state.params, held_out, state.fitness_state)))
        rows.append([f"`{env_id}`", f"{before:.1f}", *(f"{r:.1f}" for r in returns),
                     f"{time.perf_counter() - start:.0f} s"])
        print(" | ".join(str(c) for c in rows[-1]), flush=True)
    header = ["environment", "generation 0", *(f"{quarter * (i + 1)}" for i in range(4)), "wall time"]
    print()
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()
