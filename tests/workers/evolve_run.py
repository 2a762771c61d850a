"""One ES run written to disk, for the multi-process tests (run as a script, one per process).

    python tests/workers/evolve_run.py OUT_DIR [--report] [--continue-locally] [--strategy NAME]
                                       [--hidden H] [--exchange MODE]
                                       [--sleep-before-initialize-on-rank R] [--forever]

Initializes es.distributed (a no-op in a plain process), evolves a small
policy-like problem whose fitness uses its key in two calls of 3 + 2
generations on es.make_mesh() (every device of every process), optionally
continues two generations with mesh=None (each process alone), and writes
``OUT_DIR/rank{r}.npz`` (the final state and the metrics, fetched on every
process) and ``OUT_DIR/rank{r}.json`` (process layout and, with ``--report``, the
collectives report).
"""

import argparse
import json
import os
import sys
import time

import es

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--sleep-before-initialize-on-rank", type=int, default=None)
parser.add_argument("--report", action="store_true", help="also write es.collectives_report's findings")
parser.add_argument("--continue-locally", action="store_true", help="then 2 generations with mesh=None")
parser.add_argument("--forever", action="store_true", help="keep evolving until killed")
parser.add_argument("--strategy", default="OpenES", help="a name of es.STRATEGIES (popsize 32, sigma 0.1)")
parser.add_argument("--hidden", type=int, default=16, help="hidden width: 8*H params (H > 1024: the split update)")
parser.add_argument("--exchange", default="fitness", help="es.evolve's exchange= on the mesh")
args = parser.parse_args()

rank = int(os.environ.get(es.distributed.ENV_PROCESS_ID, "0"))
if args.sleep_before_initialize_on_rank == rank:
    time.sleep(600)
group = es.distributed.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402


def policy_return(params, key):
    """A short noisy rollout: a scan from constant carries, matmuls, and the key."""
    def step(carry, step_key):
        obs, total = carry
        action = jnp.tanh(jnp.tanh(obs @ params["w1"]) @ params["w2"])
        obs = 0.9 * obs + 0.1 * action + 0.1 * jax.random.normal(step_key, obs.shape)
        return (obs, total - jnp.sum(obs**2)), None

    (_, total), _ = jax.lax.scan(step, (jnp.ones(4), 0.0), jax.random.split(key, 10))
    return total


strategy = (es.OpenES(popsize=32, sigma=0.1, optimizer=optax.adam(0.05)) if args.strategy == "OpenES"
            else es.STRATEGIES[args.strategy](popsize=32, sigma=0.1))
k1, k2 = jax.random.split(jax.random.key(1))
params = {"w1": 0.1 * jax.random.normal(k1, (4, args.hidden)), "w2": 0.1 * jax.random.normal(k2, (args.hidden, 4))}
state = strategy.init(jax.random.key(0), params)
mesh = es.make_mesh()
print(f"process {group.process_id} of {group.num_processes} ({group.source}), pid {os.getpid()}, "
      f"mesh of {mesh.size} devices, {jax.local_device_count()} local", flush=True)

if args.forever:
    while True:
        state, _ = es.evolve(strategy, policy_return, state, 2, mesh=mesh)
        jax.block_until_ready(state)
        print(f"evolving, generation {int(state.generation)}", flush=True)

state, first = es.evolve(strategy, policy_return, state, 2, mesh=mesh, exchange=args.exchange)
state, second = es.evolve(strategy, policy_return, state, 2, mesh=mesh, exchange=args.exchange)  # from global arrays
metrics = jax.tree.map(lambda a, b: np.concatenate([a, b]), es.distributed.fetch(first), es.distributed.fetch(second))
results = {"state": state}
if args.continue_locally:  # mesh=None: every process continues alone on its own device, from the global state
    results["local_state"], local_metrics = es.evolve(strategy, policy_return, state, 2, mesh=None)
    metrics.update({f"local_{name}": value for name, value in es.distributed.fetch(local_metrics).items()})
flat = {}
for prefix, tree in results.items():
    host = es.distributed.fetch(tree._replace(fitness_state=None))
    flat.update({f"{prefix}/{jax.tree_util.keystr(p)}": x for p, x in jax.tree_util.tree_flatten_with_path(host)[0]})
flat.update({f"metrics/{name}": value for name, value in metrics.items()})
np.savez(os.path.join(args.out, f"rank{group.process_id}.npz"), **flat)

info = {
    "process_id": group.process_id,
    "num_processes": group.num_processes,
    "source": group.source,
    "is_writer": es.distributed.is_writer(),
    "mesh_size": mesh.size,
    "mesh_processes": sorted({d.process_index for d in mesh.devices.flat}),
    "params_replicated_on_mesh": bool(state.params["w1"].sharding.is_fully_replicated),
}
if args.continue_locally:
    info["local_state_on_this_process"] = bool(results["local_state"].params["w1"].is_fully_addressable)
if args.report:
    report = es.collectives_report(strategy, policy_return, state, mesh, exchange=args.exchange)
    info["report_total_bytes"] = report.total_bytes
    info["report_ops"] = sorted({c.op for c in report.crossing})
    info["report_group_sizes"] = sorted({c.group_size for c in report.crossing})
if group.num_processes > 1:
    try:
        es.make_mesh(group.num_processes + 1)
    except ValueError as error:
        info["odd_mesh_error"] = str(error)
with open(os.path.join(args.out, f"rank{group.process_id}.json"), "w") as f:
    json.dump(info, f)
print("done", flush=True)
sys.exit(0)
