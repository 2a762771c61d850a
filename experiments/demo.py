"""Demo: OpenAI-ES on the 1,000-dimensional Rastrigin function across all local CPU devices.

    python -m experiments.demo [--generations 1000] [--popsize 256]

Each CPU core is exposed to JAX as one device (unless XLA_FLAGS already says
otherwise), the population is sharded across them, and only fitness scalars
cross devices.
"""

from __future__ import annotations

import argparse
import time

from experiments.devices import emulate_cpu_devices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=1000)
    parser.add_argument("--generations", type=int, default=1000)
    parser.add_argument("--popsize", type=int, default=256)
    parser.add_argument("--report-every", type=int, default=100)
    args = parser.parse_args()

    emulate_cpu_devices()
    import jax
    import jax.numpy as jnp
    import optax

    import es

    def rastrigin(x, key):
        del key
        return -(10.0 * x.size + jnp.sum(x**2 - 10.0 * jnp.cos(2 * jnp.pi * x)))

    mesh = es.make_mesh()
    gens = args.generations
    strategy = es.OpenES(
        popsize=args.popsize,
        sigma=optax.cosine_decay_schedule(1.0, gens, alpha=0.02),
        optimizer=optax.adam(optax.cosine_decay_schedule(0.1, gens, alpha=0.01)),
    )
    start_params = jax.random.uniform(jax.random.key(1), (args.dim,), minval=-5.12, maxval=5.12)
    state = strategy.init(jax.random.key(0), start_params)
    print(
        f"OpenAI-ES on {args.dim}-D Rastrigin: popsize {args.popsize}, {gens} generations, "
        f"{mesh.size} device(s) {[str(d) for d in mesh.devices.flat]}"
    )
    print(f"Rastrigin at the start: {-float(rastrigin(start_params, None)):,.1f} (optimum 0)")
    print(es.collectives_report(strategy, rastrigin, state, mesh))

    start = time.perf_counter()
    done = 0
    while done < gens:
        chunk = min(args.report_every, gens - done)
        state, metrics = es.evolve(strategy, rastrigin, state, chunk, mesh=mesh)
        done += chunk
        elapsed = time.perf_counter() - start
        print(
            f"gen {done:5d}  rastrigin(mean) {-float(rastrigin(state.params, None)):10.1f}  "
            f"population mean {-float(metrics['fitness_mean'][-1]):10.1f}  "
            f"sigma {float(metrics['sigma'][-1]):.3f}  {done / elapsed:6.1f} gen/s",
            flush=True,
        )
    final = -float(rastrigin(state.params, None))
    initial = -float(rastrigin(start_params, None))
    print(f"Result: Rastrigin {initial:,.1f} -> {final:,.1f} ({initial / final:.0f}x lower) "
          f"in {time.perf_counter() - start:.1f} s on {mesh.size} device(s)")


if __name__ == "__main__":
    main()
