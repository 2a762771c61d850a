"""How a run executes (``Execution``), and every check of ``es.evolve``'s arguments, made before compiling."""

from __future__ import annotations

import dataclasses

import jax
from jax.sharding import Mesh

from es import validation
from es.engine.batching import default_update_batch_size
from es.engine.partition import BLOCK, Partition, slice_size
from es.engine.stopping import OnTheState, StopCriteria
from es.fitness import Fitness, JaxFitness
from es.noise import Layout
from es.parallel.mesh import resolve_mesh
from es.strategies.base import State, Strategy, Sums, initial_state

EXCHANGE_MODES = ("fitness", "sharded", "gradient", "auto")
"""The accepted ``exchange=`` values; ``"auto"`` resolves to ``"sharded"`` or ``"fitness"`` (``resolve_exchange``)."""


@dataclasses.dataclass(frozen=True)
class Execution:
    """How a run executes (static; resolved by ``check_evolve_args``).

    Attributes:
      exchange: ``"fitness"`` (only fitnesses cross devices; every device
        rebuilds every member's noise for the update; bit-identical on any
        device count), ``"sharded"`` (each device rebuilds its ``1/n`` slice
        of the coordinates of every member's noise and the slices of the sums
        are all-gathered; the same bits as ``"fitness"``) or ``"gradient"``
        (each device sums its own members and the params-sized sums are
        all-reduced; rounding depends on the device count).
      eval_batch_size: members evaluated together by one vmapped call.
      update_batch_size: noise vectors rebuilt per step of the sums.
      shard_update: ``"sharded"`` with a coordinatewise strategy and ``D``
        large enough to split: each device also updates only its slice of
        the coordinates and keeps its slice of the private state and best
        params between generations (``es.engine.update``).
      criteria: the thresholds of the stopping conditions reported each generation (the metric ``"stop"``),
        or ``None``: no condition is computed (``"stop"`` is 0) and the fitness history they read
        (``State.stop_history``) is left as it was, which keeps both out of the program (about a third of an
        ``es.evolve`` program's compile time); or ``stopping.OnTheState(criteria)``: only the conditions on the
        state, the history kept by the caller (es.minimize's loop, on the host).
      track_best: whether ``State.best_params`` follows the best member (rebuilt from its key when a generation
        beats it). ``False`` for a driver that keeps its best point itself (``es.minimize``): the rebuild, an
        eighth of its program, is left out and ``best_params`` stays as it was; ``best_fitness`` is kept either way.
    """

    exchange: str
    eval_batch_size: int
    update_batch_size: int
    shard_update: bool = False
    criteria: StopCriteria | OnTheState | None = None
    track_best: bool = True

    def identity(self, num_devices: int) -> dict:
        """What of the execution determines a run's results (JSON): a resume must not change it.

        The batch sizes fix the shapes and the summation order. The device
        count matters only for ``"gradient"``, whose all-reduce rounds by device.
        """
        identity = {"eval_batch_size": self.eval_batch_size, "update_batch_size": self.update_batch_size}
        if self.exchange == "gradient":
            identity["gradient_exchange_devices"] = num_devices
        return identity


def num_params(params) -> int:
    """Total number of scalars in ``params``."""
    return Layout.of(params).dim


def check_evolve_args(
    strategy, fitness: Fitness, state, num_generations, mesh, exchange="fitness", eval_batch_size=None,
    update_batch_size=None, stop_criteria=None,
) -> tuple[Mesh, Execution]:
    """Validate ``evolve``'s arguments before any compilation; return the mesh and the execution. ``fitness`` is
    the adapter the entry point made (``es.fitness.adapter``)."""
    if not isinstance(strategy, Strategy):
        raise TypeError(
            f"strategy must be an es strategy (es.OpenES, es.SNES, es.PGPE, es.ARS, es.SepCMAES, es.CMAES), "
            f"got {type(strategy).__name__}."
        )
    if not isinstance(fitness, Fitness):
        raise TypeError(f"check_evolve_args: adapt the fitness first (es.fitness.adapter), got {type(fitness).__name__}.")
    if not validation.is_int(num_generations):
        raise TypeError(
            f"num_generations must be a Python int (it is the static scan length), got {num_generations!r}."
        )
    if num_generations < 0:
        raise ValueError(f"num_generations={num_generations} is negative; use 0 or more generations.")
    # The checks below trace strategy.init and the fitness (most of a warm call's time): once per signature.
    key = None if fitness.on_host else (signature(strategy, state), fitness, mesh, exchange, eval_batch_size,
                                        update_batch_size, stop_criteria)
    try:
        return _EVOLVE_CHECKED[key]
    except (KeyError, TypeError):  # new, or unhashable (an identity-hashed host fitness is never remembered)
        pass
    mesh = resolve_mesh(mesh)
    if strategy.popsize % mesh.size:
        raise ValueError(
            f"popsize={strategy.popsize} is not divisible by the mesh's {mesh.size} devices; "
            f"use a multiple of {mesh.size} (e.g. {-(-strategy.popsize // mesh.size) * mesh.size}) "
            f"or a mesh whose size divides {strategy.popsize}."
        )
    if fitness.shared_by == "pair" and not strategy.antithetic:
        raise ValueError(
            f"es.CommonRandomNumbers(shared_by='pair') shares a key within antithetic pairs, but this "
            f"{type(strategy).__name__} has antithetic=False; use shared_by='generation' or an antithetic strategy."
        )
    check_state(strategy, fitness, state)
    layout = Layout.of(state.params)
    check_noise(strategy, state, layout)
    check_fitness_input(strategy, fitness, state, layout)
    execution = resolve_execution(strategy, layout, exchange, eval_batch_size, update_batch_size, mesh.size, fitness,
                                  stop_criteria)
    if key is not None:
        try:
            remember(_EVOLVE_CHECKED, key, (mesh, execution))
        except TypeError:  # an unhashable strategy or setting: checked every time
            pass
    return mesh, execution


_EVOLVE_CHECKED: dict = {}  # check_evolve_args's key -> (mesh, execution) of arguments that passed


def signature(strategy: Strategy, state: State) -> tuple:
    """``(strategy, the state's tree structure, each leaf's type, shape, dtype and weak type)``: everything the
    checks of a (strategy, state) pair read, and what the programs compiled for the pair require of their
    arguments (a state with the same signature passes the same checks)."""
    leaves, treedef = jax.tree.flatten(state)
    shapes = tuple((type(x), getattr(x, "shape", None), getattr(x, "dtype", None), getattr(x, "weak_type", False))
                   for x in leaves)
    return strategy, treedef, shapes


def remember(cache: dict, key, value) -> None:
    """``cache[key] = value``, the cache emptied first when it holds 512 entries."""
    if len(cache) >= 512:
        cache.clear()
    cache[key] = value


def check_noise(strategy: Strategy, state: State, layout: Layout) -> None:
    """The noise source can serve these params and this strategy (before compiling)."""
    strategy.noise.check(layout)
    if strategy.noise.factored:
        hp = strategy.hyperparameters(layout.dim)
        scale = jax.eval_shape(strategy.scale, hp, state.strategy_state, state.generation)
        if scale.shape != ():
            raise ValueError(
                f"{type(strategy).__name__} perturbs each coordinate with its own scale (scale is "
                f"float32{list(scale.shape)}), but LowRankNoise(factored=True) needs one scale per member to keep "
                "A @ B.T factored; use LowRankNoise(factored=False) or a strategy with a scalar sigma."
            )


def check_fitness_input(strategy: Strategy, fitness, state: State, layout: Layout) -> None:
    """The fitness (an adapter) accepts what it will receive (``es.LowRank`` matrix leaves when factored)."""
    if not strategy.noise.factored:
        fitness.check(state.params, state.key, state.fitness_state, strategy.popsize)
        return
    if fitness.on_host:
        raise TypeError(
            "LowRankNoise(factored=True) passes es.LowRank matrix leaves, which only a JAX fitness function can "
            "take; with an es.HostFitness use LowRankNoise(factored=False), whose members are plain arrays."
        )
    example = strategy.noise.factored_example(state.params, layout)
    try:
        fitness.check(example, state.key, state.fitness_state, strategy.popsize)
    except Exception as error:  # whatever the user's code raises on an es.LowRank leaf
        raise TypeError(
            "fitness_fn fails on what LowRankNoise(factored=True) passes it: every matrix leaf (2 or more axes) "
            "arrives as an es.LowRank(base, factors, scale), not an array. Multiply by weights with "
            "es.matmul(x, w), or call w.materialise() / es.materialise(w); see docs/lowrank.md. "
            f"The error was {type(error).__name__}: {error}"
        ) from error


def resolve_exchange(strategy: Strategy, layout: Layout, num_devices: int) -> str:
    """What ``exchange="auto"`` runs: ``"sharded"`` when the update can be split (several devices, a noise
    source that can rebuild coordinate slices, and ``D`` large enough that each device gets fewer than all of
    them: ``slice_size``), else ``"fitness"``. The two give the same bits, so the choice changes only the
    cost (docs/scaling.md)."""
    splits = num_devices > 1 and strategy.noise.sliceable and slice_size(layout.dim, num_devices) < layout.dim
    return "sharded" if splits else "fitness"


def splits_update(strategy: Strategy, dim: int, num_devices: int) -> bool:
    """Whether ``exchange="sharded"`` splits the update itself: a coordinatewise strategy, noise that can be
    sliced, and more coordinates than one device's slice."""
    return strategy.coordinatewise and strategy.noise.sliceable and Partition(dim, num_devices, BLOCK).split


def resolve_execution(
    strategy, layout: Layout, exchange, eval_batch_size, update_batch_size, num_devices: int = 1, fitness=None,
    stop_criteria=None,
) -> Execution:
    """The ``Execution`` of a run: ``exchange`` checked (``"auto"`` resolved), automatic batch sizes filled in.

    ``fitness`` (an adapter, or ``None`` for a JAX fitness) picks the default
    evaluation batch: ``es.HostFitness`` evaluates each device's whole share at once.
    """
    validation.check_choice("es.evolve", "exchange", exchange, EXCHANGE_MODES)
    if exchange == "auto":
        exchange = resolve_exchange(strategy, layout, num_devices)
    if exchange == "sharded" and not strategy.noise.sliceable:
        raise ValueError(
            f"es.evolve(exchange='sharded') with {type(strategy.noise).__name__}: its update is one matrix "
            "product per chunk of members, which cannot be split into coordinate slices that round like the "
            "whole; use exchange='fitness' (or 'auto', which picks it) with low-rank noise."
        )
    eval_batch_size = validation.check_optional_int("es.evolve", "eval_batch_size", eval_batch_size)
    update_batch_size = validation.check_optional_int("es.evolve", "update_batch_size", update_batch_size)
    if stop_criteria is not None and not isinstance(stop_criteria, StopCriteria):
        raise TypeError(f"es.evolve(stop_criteria={stop_criteria!r}): use an es.StopCriteria(...) or None.")
    draw = strategy.noise.draw_size(layout)
    evaluated = draw if strategy.noise.factored else layout.dim  # floats of one member's fitness input
    if eval_batch_size is None:
        fitness = fitness or JaxFitness
        eval_batch_size = fitness.default_eval_batch_size(strategy.popsize, strategy.antithetic, evaluated)
    return Execution(
        exchange=exchange,
        eval_batch_size=eval_batch_size,
        update_batch_size=update_batch_size or default_update_batch_size(draw),
        shard_update=exchange == "sharded" and splits_update(strategy, layout.dim, num_devices),
        criteria=stop_criteria,
    )


def check_state(strategy: Strategy, fitness, state) -> None:
    """Raise ``ValueError``/``TypeError`` unless ``state`` belongs to ``strategy`` (and ``fitness``, an adapter or None)."""
    if not isinstance(state, State):
        raise TypeError(f"state must be an es.State from strategy.init(key, params), got {type(state).__name__}.")
    validation.check_params(state.params, "state.params")
    validation.check_key(state.key)
    expected = jax.eval_shape(lambda: initial_state(strategy, state.key, state.params, None))
    for name in ("strategy_state", "stop_history"):
        difference = validation.tree_difference(getattr(state, name), getattr(expected, name))
        if difference is not None:
            raise ValueError(
                f"state.{name} does not match this {type(strategy).__name__}(popsize={strategy.popsize}) for "
                f"state.params: {difference}. The state was made by a different strategy (another kind, "
                "popsize, optimizer or settings) or for other params. Create it with strategy.init(key, params) "
                "using this strategy."
            )
    if jax.tree.structure(state.best_params) != jax.tree.structure(state.params):
        raise ValueError("state.best_params does not match state.params; create the state with strategy.init.")
    stateful = fitness is not None and fitness.stateful
    if stateful and state.fitness_state is None:
        raise ValueError(
            "fitness_fn is stateful (an es.StatefulFitness, or an es.HostFitness with init/update/stats) but "
            "state.fitness_state is None; create the state with strategy.init(key, params, fitness=fitness_fn)."
        )
    if stateful and jax.tree.structure(jax.eval_shape(fitness.initial_state)) != jax.tree.structure(state.fitness_state):
        raise ValueError(
            "state.fitness_state does not match fitness_fn.init(); create the state with "
            "strategy.init(key, params, fitness=fitness_fn)."
        )


def trace_update(strategy: Strategy, state: State) -> None:
    """Trace one generation's coefficients and update of ``strategy`` from ``state`` on shapes alone (nothing
    is allocated in proportion to the population or the params): what a bad setting breaks fails here."""
    dim = Layout.of(state.params).dim
    hp = strategy.hyperparameters(dim)
    dtype = jax.numpy.result_type(float)

    def one_update(strategy_state, fitness, mean):
        coefficients = strategy.coefficients(hp, strategy_state, fitness)
        given = coefficients._asdict()
        sums = Sums(*(None if given[name] is None else jax.numpy.zeros((dim, dim) if name == "outer" else (dim,), dtype)
                      for name in Sums._fields))
        return strategy.update(hp, strategy_state, mean, coefficients, sums, state.generation)

    jax.eval_shape(one_update, state.strategy_state, jax.ShapeDtypeStruct((strategy.popsize,), dtype),
                   jax.ShapeDtypeStruct((dim,), dtype))
