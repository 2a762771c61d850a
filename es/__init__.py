"""es: evolution strategies in JAX.

The whole run is compiled, the population is ``shard_map``ped over a device
mesh, and only fitness scalars cross devices: every perturbation is rebuilt
from shared keys, so results are bit-identical on any number of devices.

    strategy = es.OpenES(popsize=256, sigma=0.05, optimizer=optax.adam(1e-2))   # or es.SNES, es.PGPE, ...
    state = strategy.init(jax.random.key(0), params)
    state, metrics = es.evolve(strategy, fitness_fn, state, 100, mesh=es.make_mesh())
    result = es.run(strategy, fitness_fn, state, 1000, run_dir="runs/x")  # progress, log, checkpoints

Importing ``es`` creates no JAX arrays and starts no backend, so
``es.distributed.initialize()`` can follow it; after that ``es.make_mesh()``
spans every process's devices (``docs/distributed.md``, ``python -m es.launch``).
"""

from es.startup import long_lived_imports as _long_lived_imports

with _long_lived_imports():  # JAX's and es's ~120,000 lifelong objects: never traversed by the collector (es.startup)
    from es import noise, validation
    from es.compilation_cache import enable_compilation_cache
    from es.blackbox import MinimizeResult, minimize
    from es.engine import stopping
    from es.engine.ask_tell import ask, stop_reasons, tell
    from es.engine.evolution import evolve
    from es.engine.execution import EXCHANGE_MODES
    from es.engine.generation import METRIC_NAMES, generation_step
    from es.engine.stopping import StopCriteria
    from es.engine.sweep import evolve_many
    from es.fitness import CommonRandomNumbers, Fitness, StatefulFitness
    from es.host import FitnessError, HostFitness
    from es.noise import GaussianNoise, Layout, LowRank, LowRankNoise, NoiseSource, NoiseTable, matmul, materialise
    from es.parallel import distributed
    from es.parallel.collectives import (
        Collective, CollectivesReport, ExchangeCost, ExchangeReport, collectives_report, compiled_generation_hlo,
        exchange_report,
    )
    from es.parallel.distributed import is_writer
    from es.parallel.mesh import POPULATION_AXIS, make_mesh
    from es.runs import checkpoint
    from es.runs.checkpoint import CheckpointError, CheckpointWarning
    from es.runs.params_file import load_params
    from es.runs.run import RunResult, Segment, run, run_many
    from es.runs.storage import RunDirError
    from es.runs.seeding import init_from_seed
    from es.strategies import (
        ARS, CMAES, PGPE, SNES, STRATEGIES, ARSState, CMAESState, OpenES, OpenESState, PGPEState, SepCMAES,
        SepCMAESState, SNESState, optimizers, shaping,
    )
    from es.strategies.base import Coefficients, PerCoordinate, Private, State, Step, Strategy, Sums
    from es.strategies.optimizers import ClipUpState, clipup

__version__ = "0.1.0"

__all__ = [
    "ARS",
    "ARSState",
    "CMAES",
    "CMAESState",
    "PGPE",
    "PGPEState",
    "SNES",
    "SNESState",
    "SepCMAES",
    "SepCMAESState",
    "ask",
    "stop_reasons",
    "tell",
    "CheckpointError",
    "CheckpointWarning",
    "ClipUpState",
    "Coefficients",
    "Collective",
    "CommonRandomNumbers",
    "CollectivesReport",
    "EXCHANGE_MODES",
    "ExchangeCost",
    "ExchangeReport",
    "Fitness",
    "FitnessError",
    "GaussianNoise",
    "HostFitness",
    "Layout",
    "LowRank",
    "LowRankNoise",
    "METRIC_NAMES",
    "MinimizeResult",
    "NoiseSource",
    "NoiseTable",
    "OpenES",
    "OpenESState",
    "PerCoordinate",
    "Private",
    "POPULATION_AXIS",
    "RunDirError",
    "RunResult",
    "Segment",
    "STRATEGIES",
    "State",
    "Step",
    "StopCriteria",
    "StatefulFitness",
    "Strategy",
    "Sums",
    "checkpoint",
    "clipup",
    "collectives_report",
    "compiled_generation_hlo",
    "distributed",
    "enable_compilation_cache",
    "evolve",
    "evolve_many",
    "exchange_report",
    "generation_step",
    "init_from_seed",
    "is_writer",
    "load_params",
    "make_mesh",
    "materialise",
    "matmul",
    "minimize",
    "noise",
    "optimizers",
    "run",
    "run_many",
    "shaping",
    "stopping",
    "validation",
]
