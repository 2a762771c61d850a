#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md ("On a GPU"), in one run of a few minutes on a machine with one GPU:
#
#     OUT=/tmp/gpu bash experiments/bench/gpu.sh      # writes $OUT/gpu.tgz (every log and result) as it goes
#     STEPS="smoke suite" bash experiments/bench/gpu.sh   # some of the steps (default: all)
#
# Each step is bounded by its own timeout, so one slow or failing step leaves the others' results. jax with
# CUDA must be installed; es runs from this checkout (PYTHONPATH). Wheels in .whl/ (evosax, gymnax and their
# pure-Python needs, for a machine without a package index) are installed into /tmp/site first.
set -u
OUT=${OUT:-/tmp/gpu}
WORK=$(mktemp -d)
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# Several worker processes share the GPU (the suite runs es and evosax side by side): no process takes 75% of its
# memory up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 MPLBACKEND=Agg
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$WORK/gpu.txt" 2>&1

step() {  # step NAME SECONDS COMMAND...: run COMMAND with a timeout, its output in NAME.log, then pack the results
    local name=$1 limit=$2 began
    shift 2
    [[ ${STEPS:-all} == all || " ${STEPS:-} " == *" $name "* ]] || return 0
    began=$(date +%s)
    timeout "$limit" "$@" >"$WORK/$name.log" 2>&1
    echo "== $name: exit $? after $(($(date +%s) - began)) s" | tee -a "$WORK/steps.txt"
    tail -n 4 "$WORK/$name.log"
    tar czf "$OUT/gpu.tgz" -C "$WORK" .
}

step smoke 60 python3 -c '
import time, jax, jax.numpy as jnp, es
print(jax.devices())
sphere = lambda x, key: -jnp.sum(x * x)
for strategy in (es.OpenES(popsize=1024, sigma=0.01), es.CMAES(popsize=16, sigma=0.5)):
    state = strategy.init(jax.random.key(0), jnp.full(1000 if strategy.popsize > 16 else 10, 0.5))
    for call in range(2):
        began = time.perf_counter()
        state, _ = es.evolve(strategy, sphere, state, num_generations=20)
        jax.block_until_ready(state)
        print(type(strategy).__name__, "call", call, f"{time.perf_counter() - began:.3f} s")
'
step suite 200 python3 -m experiments.bench.suite --rounds 3 --mem-limit-gib 100 --out "$WORK/suite.json" \
    --sphere 100000x1024 1000000x1024 1000000x4096 10000000x1024
# The tasks with es evaluating the whole population at once (one GPU; the default divides it by 8, below).
step tasks_one_batch 90 python3 -m experiments.bench.suite --rounds 3 --sphere --eval-batch-size 256 \
    --out "$WORK/tasks_one_batch.json"
step strategies 80 python3 -m experiments.bench.strategies --no-quality --speed 1000000x1024 --rounds 3 \
    --out "$WORK/strategies.json"
step demo 40 python3 -m experiments.train experiments/configs/demo.yaml
step compile_time 70 python3 -m experiments.bench.compile_time --evosax --rounds 1 --strategies CMAES SNES OpenES \
    --out "$WORK/compile_time.json"
