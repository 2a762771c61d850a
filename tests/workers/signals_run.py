"""es.run with a fitness that takes long, for the tests of what SIGINT and SIGTERM do (run as a script).

    python tests/workers/signals_run.py OUT_DIR --kind host|jax [--segment N] [--generations G]

``--kind host``: an es.HostFitness of 2 workers whose members take 0.2 s each, write their worker's pid to
``OUT_DIR/pids/`` and, once done, a line to ``OUT_DIR/evaluated`` (8 a generation). ``--kind jax``: a JAX
fitness whose members take microseconds. Once ``OUT_DIR/hang`` exists, every host member sleeps 600 s and every
JAX member (a host callback looks for the file) runs a loop of minutes, so the generation or segment in progress
never ends by itself. Both run G generations (default 200) in segments of N (default 50) into ``OUT_DIR/run``,
print ``stopped_by <signal> at generation <g>`` when es.run returns, and let what es.run raises end the script
(KeyboardInterrupt, or SystemExit 143).
"""

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

import es

STRATEGY = es.OpenES(popsize=8, sigma=0.1)


def host_member(params, seed):
    out = Path(os.environ["SIGNALS_RUN_OUT"])
    (out / "pids").mkdir(parents=True, exist_ok=True)
    (out / "pids" / str(os.getpid())).touch()
    time.sleep(600 if (out / "hang").exists() else 0.2)
    with open(out / "evaluated", "a") as evaluated:  # one short append: whole lines from either worker
        evaluated.write(".\n")
    return -float(np.sum(params["x"] ** 2))


def jax_member(params, key):
    import jax
    import jax.numpy as jnp

    del key
    hang = jax.pure_callback(lambda: np.bool_((Path(os.environ["SIGNALS_RUN_OUT"]) / "hang").exists()),
                             jax.ShapeDtypeStruct((), jnp.bool_), vmap_method="broadcast_all")
    steps = jnp.where(hang, 2_000_000_000, 10)
    total = jax.lax.fori_loop(0, steps, lambda i, v: v * 0.999999 + 1e-9, jnp.sum(params["x"]))
    return -total


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--kind", choices=("host", "jax"), required=True)
    parser.add_argument("--segment", type=int, default=50)
    parser.add_argument("--generations", type=int, default=200)
    args = parser.parse_args()
    os.environ["SIGNALS_RUN_OUT"] = args.out

    import jax
    import jax.numpy as jnp

    fitness = es.HostFitness(host_member, num_workers=2) if args.kind == "host" else jax_member
    state = STRATEGY.init(jax.random.key(0), {"x": jnp.linspace(-1.0, 1.0, 5)})
    print("started", flush=True)
    result = es.run(STRATEGY, fitness, state, args.generations, run_dir=os.path.join(args.out, "run"), segment=args.segment,
                    progress=False)
    print(f"stopped_by {result.stopped_by} at generation {int(result.state.generation)}", flush=True)
    sys.exit(0)
