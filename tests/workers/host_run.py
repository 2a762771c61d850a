"""An ES run with an es.HostFitness, for the multi-process and Ctrl-C tests (run as a script, one per process).

    python tests/workers/host_run.py OUT_DIR [--fail-on-rank R] [--slow-on-rank R] [--hang] [--run [--segment N]]
                                     [--slow]

Initializes es.distributed (a no-op in a plain process), evolves ``HOST_PROBLEM``
for 3 generations with 2 workers per process on es.make_mesh(), and writes
``OUT_DIR/rank{r}.npz`` (the final params). ``--fail-on-rank R``: fn raises on
process R's members; ``--slow-on-rank R``: each of process R's members takes 1 s (its share ends about 2 s
after the other process's, every generation). ``--hang``: fn writes its worker's pid to ``OUT_DIR/pids/``
and sleeps, so that a test can interrupt the run. ``--run``: es.run for 200
generations of slow members (0.2 s each), checkpointing every generation
(``--segment N``: every N) in ``OUT_DIR/run``, printing ``stopped_by <signal>``
when it returns. ``--slow``: one generation of members that take 0.5 s each on
one worker, on a 2-device mesh (the devices' shares finish 2 s apart). Prints
``FitnessError: ...`` and exits 3 on a FitnessError; prints ``INTERRUPTED`` when
Ctrl-C reaches the script, then lets the KeyboardInterrupt end it.
"""

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

import es

STRATEGY = es.OpenES(popsize=8, sigma=0.1)
INTERRUPTED = "KeyboardInterrupt reached the script"
GENERATIONS = 3


def host_problem(params, seed):
    """A noisy sphere in numpy: depends only on the member's params and its seed."""
    noise = np.random.default_rng(seed).normal()
    return -float(np.sum(params["x"] ** 2)) + 0.01 * noise


def failing(params, seed):
    raise ValueError("simulator failed on this process")


def make_hanging(pid_dir):
    def hanging(params, seed):
        Path(pid_dir).mkdir(parents=True, exist_ok=True)
        (Path(pid_dir) / str(os.getpid())).touch()
        time.sleep(600)
        return 0.0

    return hanging


def slow_member(params, seed):
    Path(os.environ["HOST_RUN_PIDS"]).mkdir(parents=True, exist_ok=True)
    (Path(os.environ["HOST_RUN_PIDS"]) / str(os.getpid())).touch()
    time.sleep(0.2)
    return host_problem(params, seed)


def one_second(params, seed):
    time.sleep(1.0)
    return host_problem(params, seed)


def half_a_second(params, seed):
    time.sleep(0.5)
    return host_problem(params, seed)


def initial_state():
    import jax
    import jax.numpy as jnp

    return STRATEGY.init(jax.random.key(0), {"x": jnp.linspace(-1.0, 1.0, 5)})


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--fail-on-rank", type=int, default=None)
    parser.add_argument("--slow-on-rank", type=int, default=None)
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--run", action="store_true")
    parser.add_argument("--segment", type=int, default=1)
    parser.add_argument("--slow", action="store_true")
    args = parser.parse_args()
    # Ctrl-C raises KeyboardInterrupt here as at a terminal, even when the suite was started with SIGINT ignored
    # (a background `nohup ... &`), whose disposition this child would otherwise inherit.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    group = es.distributed.initialize()
    fn = host_problem
    if args.fail_on_rank == group.process_id:
        fn = failing
    if args.slow_on_rank == group.process_id:
        fn = one_second
    if args.hang:
        fn = make_hanging(os.path.join(args.out, "pids"))
    fitness = es.HostFitness(fn, num_workers=2)
    print(f"process {group.process_id} of {group.num_processes}, pid {os.getpid()}", flush=True)
    if args.run:
        os.environ["HOST_RUN_PIDS"] = os.path.join(args.out, "pids")
        result = es.run(STRATEGY, es.HostFitness(slow_member, num_workers=2), initial_state(), 200,
                        run_dir=os.path.join(args.out, "run"), segment=args.segment, progress=False)
        print(f"stopped_by {result.stopped_by} at generation {int(result.state.generation)}", flush=True)
        sys.exit(0)
    if args.slow:
        with es.HostFitness(half_a_second, num_workers=1) as slow:
            _, metrics = es.evolve(STRATEGY, slow, initial_state(), 1, mesh=es.make_mesh(2))
        print(f"done {int(metrics['num_invalid'][0])} invalid", flush=True)
        sys.exit(0)
    try:
        state, _ = es.evolve(STRATEGY, fitness, initial_state(), GENERATIONS, mesh=es.make_mesh())
    except es.FitnessError as error:
        print(f"FitnessError: {error}", flush=True)
        sys.exit(3)
    except KeyboardInterrupt:  # the moment Ctrl-C reaches the script (interpreter teardown follows)
        print(INTERRUPTED, flush=True)
        raise
    params = es.distributed.fetch(state.params)
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank{group.process_id}.npz"), **params)
    print("done", flush=True)
