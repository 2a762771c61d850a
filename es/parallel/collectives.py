"""What crosses devices: every collective in one compiled generation, with its bytes.

``collectives_report`` compiles a single generation for a mesh (the same step
``evolve`` scans) and reads the cross-device operations out of the optimised
HLO, so the report shows what the compiler actually emits rather than what the
code intends. The program is never run, so on a CPU its machine code is left unoptimised
(``REPORT_COMPILER_OPTIONS``): the same HLO, about 40% less compile time.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Callable, NamedTuple

import jax
from jax.sharding import Mesh

from es.engine import evolution as engine_evolve
from es.engine import execution as engine_execution
from es.engine import update as engine_update
from es.engine.compiler import compile_with
from es.engine.generation import evaluates_pairs
from es.engine.partition import BLOCK, Partition
from es.parallel.global_arrays import replicate
from es.fitness import adapter
from es.parallel.mesh import resolve_mesh
from es.noise.layout import Layout
from es.strategies.base import State, Strategy

REPORT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
"""XLA's options for a report's program on a CPU: LLVM's optimisation only (the HLO passes, which place and
combine the collectives, run as by default). The same optimised HLO text as XLA's defaults (SNES, OpenES,
SepCMAES and PGPE at 10^5 params on 8 devices) in 0.55-0.69x the compile CPU (docs/benchmarks.md)."""

COLLECTIVE_OPS = (
    "all-gather",
    "all-reduce",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
    "ragged-all-to-all",
)

_DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128)\[([0-9,]*)\]")
_EXPLICIT_GROUPS = re.compile(r"replica_groups=\{(\{[0-9,]*\})")
_IOTA_GROUPS = re.compile(r"replica_groups=\[(\d+),(\d+)\]")
_INSTRUCTION = re.compile(
    r"=\s*(?P<type>.+?)\s+(?P<op>" + "|".join(COLLECTIVE_OPS) + r")(?P<start>-start)?\("
)


class Collective(NamedTuple):
    """One collective: its HLO op, result type, result bytes and devices per group.

    ``bytes`` is the size of the op's result (for an all-gather, the gathered
    array every device ends up with). ``group_size`` is how many devices take
    part in each group (``None`` when the HLO does not say); an op whose groups
    hold a single device moves nothing between devices.
    """

    op: str
    result: str
    bytes: int
    group_size: int | None = None

    @property
    def crosses_devices(self) -> bool:
        return self.group_size != 1


class CollectivesReport(NamedTuple):
    """Every collective of one generation on ``num_devices`` devices."""

    num_devices: int
    collectives: tuple[Collective, ...]

    @property
    def crossing(self) -> tuple[Collective, ...]:
        """The collectives that move data between devices."""
        return tuple(c for c in self.collectives if c.crosses_devices)

    @property
    def total_bytes(self) -> int:
        """Bytes of all cross-device collectives of one generation."""
        return sum(c.bytes for c in self.crossing)

    @property
    def max_bytes(self) -> int:
        """Bytes of the largest cross-device collective."""
        return max((c.bytes for c in self.crossing), default=0)

    def __str__(self) -> str:
        lines = [f"collectives per generation on {self.num_devices} device(s):"]
        for c in self.collectives:
            where = "local (1 device per group)" if not c.crosses_devices else f"{c.group_size or '?'} devices"
            lines.append(f"  {c.op:<14} {c.result:<24} {c.bytes:>14,d} bytes  {where}")
        if not self.collectives:
            lines.append("  (none)")
        lines.append(f"  total crossing devices: {self.total_bytes:,d} bytes")
        return "\n".join(lines)


def _array_bytes(type_text: str) -> list[int]:
    return [
        _DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
        for dtype, dims in _ARRAY.findall(type_text)
    ]


def _group_size(line: str) -> int | None:
    explicit = _EXPLICIT_GROUPS.search(line)
    if explicit:
        return len([d for d in explicit[1].strip("{}").split(",") if d])
    iota = _IOTA_GROUPS.search(line)
    if iota:
        return int(iota[2])
    return None


def parse_collectives(hlo_text: str) -> tuple[Collective, ...]:
    """Collectives in an HLO module's text, with the bytes of each result.

    For asynchronous ``*-start`` ops (whose result tuple also holds the
    operand) the last array of the tuple, the output, is counted.
    """
    found = []
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.search(line)
        if not match:
            continue
        sizes = _array_bytes(match["type"])
        if not sizes:
            continue
        size = sizes[-1] if match["start"] else sum(sizes)
        found.append(Collective(match["op"], match["type"].strip(), size, _group_size(line)))
    return tuple(found)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _one_generation(program, fitness, mesh, execution, hp, state):
    # gather=False: without the all-gathers of the private state that end an evolve call (not one per generation)
    run = functools.partial(engine_evolve.run_generations, program, fitness, mesh, execution, 1, gather=False)
    return engine_evolve.shard_replicated(run, mesh)(hp, state)


def compiled_generation_hlo(
    strategy: Strategy, fitness_fn: Callable, state: State, mesh: Mesh | None = None, **execution
) -> str:
    """Optimised HLO text of one generation of ``strategy`` on ``mesh``.

    ``execution``: ``exchange``, ``eval_batch_size``, ``update_batch_size`` as for ``es.evolve``.
    """
    fitness = adapter(fitness_fn)
    mesh, resolved = engine_execution.check_evolve_args(strategy, fitness, state, 1, mesh, **execution)
    state = replicate(state, mesh)
    hp = strategy.hyperparameters(Layout.of(state.params).dim)
    lowered = _one_generation.lower(strategy.program(), fitness, mesh, resolved, hp, state)
    on_cpu = mesh.devices.flat[0].platform == "cpu"
    return compile_with(lowered, REPORT_COMPILER_OPTIONS if on_cpu else None).as_text()


def collectives_report(
    strategy: Strategy, fitness_fn: Callable, state: State, mesh: Mesh | None = None, **execution
) -> CollectivesReport:
    """Every cross-device collective of one generation, with the bytes it moves.

    Compiles ``es.evolve``'s program for one generation (``execution``:
    ``exchange``, ``eval_batch_size``, ``update_batch_size`` as for
    ``es.evolve``), without what only ends an ``evolve`` call: with a
    coordinatewise strategy and ``exchange="sharded"``, the all-gather of
    each device's slices of the optimizer state and best params (once per
    call: ``ExchangeCost.bytes_per_call``). Example::

        report = es.collectives_report(strategy, fitness_fn, state, es.make_mesh(8))
        print(report)            # one all-gather of f32[popsize] in "fitness" mode
        assert report.max_bytes <= 4 * strategy.popsize + 64

    On a one-device mesh XLA removes every collective, so the report is empty.
    """
    hlo = compiled_generation_hlo(strategy, fitness_fn, state, mesh, **execution)
    return CollectivesReport(resolve_mesh(mesh).size, parse_collectives(hlo))


# --------------------------------------------------------------------------- what each exchange mode costs


class ExchangeCost(NamedTuple):
    """What one exchange mode costs per generation, per device (a model; ``measured_bytes`` from the HLO).

    Attributes:
      mode: ``"fitness"``, ``"sharded"`` or ``"gradient"``.
      bytes: bytes crossing devices per generation by the model: the
        all-gathered fitnesses (``4 P``) plus, for ``"sharded"``, the
        all-gathered slices (``S = es.engine.partition.slice_size(D, n)``, about
        ``D / n``) of the sums (``4 n S``, twice that when the strategy
        needs ``Sums.square``) or, for a coordinatewise strategy (which
        updates its slice on each device), of the new mean and of each
        per-coordinate leaf that ``scale`` reads (SNES's sigma: ``4 n S``
        each), plus the block sums of the norms and the finite check (``4 n
        (4 S / 1024 + 1)``); and for ``"gradient"`` the all-reduced sums
        (``4 D``, or ``8 D``). Per-member statistics of a
        ``StatefulFitness`` come on top.
      bytes_per_call: bytes crossing devices once per ``evolve`` call, at
        its end: with a coordinatewise strategy and ``"sharded"``, each
        device's slices of the optimizer state and best params (``4 n S``
        each); else 0.
      measured_bytes: the same read from the compiled program
        (``collectives_report``), or ``None`` when not measured.
      eval_floats: noise floats this device draws to evaluate its ``P / n``
        members.
      update_floats: noise floats this device draws to form the update's
        sums: every noise vector for ``"fitness"``, every noise vector's
        ``1 / n`` slice for ``"sharded"``, its own members' for
        ``"gradient"``.
      bit_identical: whether results are the same bits on any device count
        (and equal to ``"fitness"``'s).
    """

    mode: str
    bytes: int
    measured_bytes: int | None
    eval_floats: int
    update_floats: int
    bit_identical: bool
    bytes_per_call: int = 0


class ExchangeReport(NamedTuple):
    """``ExchangeCost`` of every mode for one strategy, params and mesh, and the mode ``"auto"`` picks.

    Besides the noise, every device runs its ``P / n`` fitness evaluations
    and the strategy's update on all ``D`` coordinates (``O(D)``), except
    with ``"sharded"`` and a coordinatewise strategy, where it updates its
    ``S`` (``update_coordinates``).
    """

    num_devices: int
    popsize: int
    num_params: int
    auto: str
    costs: tuple[ExchangeCost, ...]
    update_coordinates: int = 0

    def __str__(self) -> str:
        lines = [
            f"exchange modes for popsize {self.popsize}, {self.num_params:,d} params, {self.num_devices} device(s) "
            f"(auto: {self.auto}); per device and generation:",
            f"  'sharded' updates {self.update_coordinates:,d} of the {self.num_params:,d} coordinates on each device",
            f"  {'mode':<9} {'bytes (model)':>14} {'bytes (HLO)':>14} {'eval noise':>14} {'update noise':>14}"
            "  bit-identical",
        ]
        for c in self.costs:
            measured = "-" if c.measured_bytes is None else f"{c.measured_bytes:,d}"
            lines.append(
                f"  {c.mode:<9} {c.bytes:>14,d} {measured:>14} {c.eval_floats:>14,d} {c.update_floats:>14,d}  "
                f"{'yes' if c.bit_identical else 'no (rounding follows the mesh)'}"
            )
        return "\n".join(lines)


def exchange_report(
    strategy: Strategy, fitness_fn: Callable, state: State, mesh: Mesh | None = None, *, measure: bool = True,
    **execution,
) -> ExchangeReport:
    """What each exchange mode moves between devices and what each device computes, per generation.

    The model counts noise floats drawn (each costs one threefry hash and an
    ``erfinv`` with ``es.GaussianNoise``, one read with ``es.NoiseTable``)
    and bytes crossing devices; with ``measure`` every mode is compiled for
    one generation and its bytes are read from the HLO
    (``collectives_report``). Modes the noise source cannot run (sharded
    low-rank noise) are left out. ``execution``: ``eval_batch_size``,
    ``update_batch_size`` as for ``es.evolve``. Example::

        print(es.exchange_report(strategy, fitness_fn, state, es.make_mesh(8)))

    docs/scaling.md explains the trade-off and has measured timings.
    """
    mesh = resolve_mesh(mesh)
    n, popsize = mesh.size, strategy.popsize
    layout = Layout.of(state.params)
    dim, noise = layout.dim, strategy.noise
    draw = noise.draw_size(layout)
    vectors = popsize // 2 if strategy.antithetic else popsize
    resolved = engine_execution.resolve_execution(strategy, layout, "fitness", execution.get("eval_batch_size"),
                                        execution.get("update_batch_size"), n)
    local = popsize // n
    pairs = evaluates_pairs(strategy, local, resolved.eval_batch_size)
    eval_floats = (local // 2 if pairs and not noise.factored else local) * draw
    sums = 2 if _uses_squares(strategy, state) else 1
    coordinatewise = strategy.coordinatewise and noise.sliceable
    part = Partition(dim, n, BLOCK if coordinatewise else 1)
    size = part.size
    sharded_bytes, per_call = 0, 0
    if part.split and coordinatewise:  # the new slices, not the sums (es/engine/update.py)
        sharded_bytes, per_call = engine_update.gathered_bytes(state, part)
    elif part.split:
        sharded_bytes = 4 * sums * n * size
    modes = {
        "fitness": (4 * popsize, vectors * draw, True, 0),
        "sharded": (4 * popsize + sharded_bytes, vectors * size, True, per_call),
        "gradient": (4 * popsize + (4 * sums * dim if n > 1 else 0), -(-vectors // n) * draw, n == 1, 0),
    }
    if not noise.sliceable:
        del modes["sharded"]
    if n == 1:
        # XLA removes every collective
        modes = {mode: (0, update, identical, 0) for mode, (_, update, identical, _) in modes.items()}
    costs = []
    for mode, (bytes_, update_floats, identical, call_bytes) in modes.items():
        measured = None
        if measure:
            measured = collectives_report(strategy, fitness_fn, state, mesh, exchange=mode, **execution).total_bytes
        costs.append(ExchangeCost(mode, bytes_, measured, eval_floats, update_floats, identical, call_bytes))
    auto = engine_execution.resolve_exchange(strategy, layout, n)
    updated = size if part.split and coordinatewise else dim
    return ExchangeReport(n, popsize, dim, auto, tuple(costs), updated)


def _uses_squares(strategy: Strategy, state: State) -> bool:
    """Whether the strategy's coefficients ask for ``Sums.square`` (what the sharded sums gather twice)."""
    hp = strategy.hyperparameters(Layout.of(state.params).dim)
    fitness = jax.ShapeDtypeStruct((strategy.popsize,), jax.numpy.result_type(float))
    return jax.eval_shape(lambda f: strategy.coefficients(hp, state.strategy_state, f), fitness).square is not None
