"""Where one generation spends its time: a jax.profiler trace, summed by phase.

    python -m experiments.bench.profile                       # sphere, 1e5 params, popsize 1,024, PRNG noise
    python -m experiments.bench.profile --noise table --params 1000000
    PYTHONPATH=/path/to/other/checkout python -m experiments.bench.profile   # profile another version of es

It compiles ``es.evolve`` for a few generations on one device, records a
``jax.profiler`` trace of one call, and attributes the time of every XLA
operation (thunk) in the trace to a phase by the ``jax.named_scope`` in the
operation's HLO metadata (``es_noise``, ``es_fitness``, ``es_evaluate``,
``es_update``, ``es_optimizer``, ``es_noise_table``); random-number
operations of versions without those scopes are recognised by name
(``threefry``, ``_normal``, ``erf_inv``). It also prints the most expensive
operations with their source op names, which is what the docs quote.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time

PHASES = (
    ("noise table build", ("es_noise_table",)),
    ("noise (PRNG draw / table read)", ("es_noise", "threefry", "_normal", "_uniform", "erf_inv", "random_bits")),
    ("fitness and member params", ("es_fitness", "es_evaluate")),
    ("gradient sum", ("es_update",)),
    ("optimizer", ("es_optimizer",)),
)
_OP_NAME = re.compile(r'^\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name="([^"]*)"')


def phase_of(op_name: str) -> str:
    for phase, markers in PHASES:
        if any(marker in op_name for marker in markers):
            return phase
    return "other"


def op_names(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> the op_name (jax name stack) in its metadata."""
    names = {}
    for line in hlo_text.splitlines():
        match = _OP_NAME.match(line)
        if match:
            names[match[1]] = match[2]
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=int, default=100_000)
    parser.add_argument("--popsize", type=int, default=1024)
    parser.add_argument("--generations", type=int, default=2)
    parser.add_argument("--noise", choices=["prng", "table"], default="prng")
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import optax

    import es

    def sphere(x, key):
        del key
        return -jnp.sum(x * x)

    kwargs = {"noise": es.NoiseTable()} if args.noise == "table" else {}
    strategy = es.OpenES(popsize=args.popsize, sigma=0.01, optimizer=optax.adam(0.01), **kwargs)
    state = strategy.init(jax.random.key(0), jnp.ones(args.params))
    compiled = jax.jit(lambda s: es.evolve(strategy, sphere, s, args.generations)).lower(state).compile()
    names = op_names(compiled.as_text())
    jax.block_until_ready(compiled(state))

    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
        start = time.perf_counter()
        jax.block_until_ready(compiled(state))
        wall = time.perf_counter() - start
        jax.profiler.stop_trace()
        path = sorted(glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True))[-1]
        with gzip.open(path) as f:
            events = json.load(f)["traceEvents"]

    per_op = collections.Counter()
    calls = collections.Counter()
    for event in events:
        name = event.get("name", "")
        if event.get("ph") == "X" and name in names and not name.startswith(("while", "conditional", "call")):
            per_op[name] += event.get("dur", 0) / 1e6
            calls[name] += 1
    per_phase = collections.Counter()
    for name, seconds in per_op.items():
        per_phase[phase_of(names[name])] += seconds
    total = sum(per_phase.values())

    print(f"# es.evolve, sphere, {args.params:,} params, popsize {args.popsize:,}, noise {args.noise}, "
          f"{args.generations} generations: {wall:.3f} s wall ({wall / args.generations:.3f} s/gen), "
          f"{total:.3f} s in XLA operations")
    print(f"# es from {os.path.dirname(es.__file__)}")
    print("| phase | seconds | share |\n|---|---|---|")
    for phase, seconds in per_phase.most_common():
        print(f"| {phase} | {seconds:.3f} | {seconds / total:.0%} |")
    print(f"\ntop {args.top} operations:")
    for name, seconds in per_op.most_common(args.top):
        print(f"  {seconds:8.3f} s {calls[name]:5d} calls  {name:32s} {names[name][-90:]}")


if __name__ == "__main__":
    main()
