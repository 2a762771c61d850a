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

from es.parallel import distributed
from es.runs import checkpoint
from es.strategies import optimizers, shaping
from es import noise, validation
from es.engine.ask_tell import ask, tell
from es.runs.checkpoint import CheckpointError, CheckpointWarning, load_params
from es.parallel.collectives import (
    Collective, CollectivesReport, ExchangeCost, ExchangeReport, collectives_report, compiled_generation_hlo,
    exchange_report,
)
from es.engine.generation import EXCHANGE_MODES, METRIC_NAMES, evolve, generation_step
from es.fitness.functions import CommonRandomNumbers, StatefulFitness
from es.host.pool import FitnessError, HostFitness
from es.parallel.mesh import POPULATION_AXIS, make_mesh
from es.noise.layout import Layout
from es.noise.lowrank import LowRank, matmul, materialise
from es.noise.sources import GaussianNoise, LowRankNoise, NoiseTable
from es.parallel.distributed import is_writer
from es.runs.run import RunResult, Segment, run, run_many
from es.runs.storage import RunDirError
from es.runs.seeding import init_from_seed
from es.strategies.optimizers import ClipUpState, clipup
from es.strategies import (
    ARS, PGPE, SNES, STRATEGIES, ARSState, OpenES, OpenESState, PGPEState, SepCMAES, SepCMAESState, SNESState,
)
from es.strategies.base import Coefficients, State, Strategy, Sums
from es.engine.sweep import evolve_many

__version__ = "0.1.0"

__all__ = [
    "ARS",
    "ARSState",
    "PGPE",
    "PGPEState",
    "SNES",
    "SNESState",
    "SepCMAES",
    "SepCMAESState",
    "ask",
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
    "FitnessError",
    "GaussianNoise",
    "HostFitness",
    "Layout",
    "LowRank",
    "LowRankNoise",
    "METRIC_NAMES",
    "NoiseTable",
    "OpenES",
    "OpenESState",
    "POPULATION_AXIS",
    "RunDirError",
    "RunResult",
    "Segment",
    "STRATEGIES",
    "State",
    "StatefulFitness",
    "Strategy",
    "Sums",
    "checkpoint",
    "clipup",
    "collectives_report",
    "compiled_generation_hlo",
    "distributed",
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
    "run",
    "run_many",
    "shaping",
]
