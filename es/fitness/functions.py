"""Fitness functions the engine accepts, and their checks.

A plain fitness function evaluates one member::

    fitness_fn(params, key) -> scalar        # higher is better when maximize=True

A ``StatefulFitness`` also carries state shared by the whole population, such
as running observation statistics (Salimans et al. 2017). Each member returns
small per-member statistics; the engine gathers them for the whole population
in member order (``popsize x stats`` floats, the only non-fitness exchange) and
every device folds them into the state with ``update`` in the same fixed order,
so results stay independent of the device count.

``CommonRandomNumbers(fitness)`` evaluates the members of a generation (or of
each antithetic pair) with one key: the same episodes, the same sampled
actions, the same environment noise, so that the differences between their
fitnesses come from their parameters alone.
"""

from __future__ import annotations

import inspect
import os
import traceback

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from es import validation
from es.engine.batching import default_eval_batch_size
from es.engine.members import EVAL_KEY_SHARING
from es.fitness.contract import Fitness, FitnessError, Fitnesses, fitness_dtype

PyTree = Any


class StatefulFitness(NamedTuple):
    """A fitness with population-wide state (e.g. observation normalisation).

    Attributes:
      init: ``() -> fitness_state``, the initial state (a pytree of arrays).
      evaluate: ``(params, key, fitness_state) -> (fitness, stats)`` for one
        member: a scalar and a pytree of small arrays.
      update: ``(fitness_state, stats) -> fitness_state`` where every leaf of
        ``stats`` has a leading ``popsize`` axis in member order.
    """

    init: Callable[[], PyTree]
    evaluate: Callable[[PyTree, jax.Array, PyTree], tuple[jax.Array, PyTree]]
    update: Callable[[PyTree, PyTree], PyTree]

    def __call__(self, params: PyTree, key: jax.Array) -> jax.Array:
        """Fitness of ``params`` under the initial state (for standalone evaluation)."""
        return self.evaluate(params, key, self.init())[0]


class CommonRandomNumbers(NamedTuple):
    """``fitness`` evaluated with common random numbers: members share their evaluation key.

    A fitness that draws randomness from its key (episodes' start states,
    sampled actions, environment noise) scores two members apart partly by
    luck. Giving them the same key removes that part of the difference, the
    variance reduction of common random numbers (Glasserman & Yao 1992),
    which EvoJAX's training loop uses for every population; with a sampled
    policy (``jax.random.categorical``, Gumbel-max) two members with close
    logits then take the same actions until their logits part. Each
    generation still draws fresh keys, and the mean is not biased: each
    member's fitness is the same random variable as with its own key.

    Args:
      fitness: what ``es.evolve`` accepts: ``fitness_fn(params, key)``, an
        ``es.StatefulFitness`` or an ``es.HostFitness`` (whose ``seed`` is
        then shared alike).
      shared_by: ``"generation"`` (every member gets the key of member 0, as
        EvoJAX does) or ``"pair"`` (the two members ``2j, 2j+1`` of an
        antithetic pair share a key; pairs differ, which keeps the
        population's fitnesses from tying where a generation-wide key makes
        many members take identical trajectories; on Breakout-MinAtar the
        generation-wide key did better, docs/concepts/common-random-numbers.md).
    """

    fitness: Any
    shared_by: str = "generation"

    def __call__(self, params: PyTree, key: jax.Array) -> jax.Array:
        """``fitness(params, key)``: the wrapped fitness, for standalone evaluation."""
        return self.fitness(params, key)


def check_shared_by(owner: str, shared_by, name: str = "shared_by") -> str:
    """``shared_by`` if it names who shares a key under common random numbers (``"generation"`` or ``"pair"``)."""
    return validation.check_choice(owner, name, shared_by, list(EVAL_KEY_SHARING[1:]))


class SharedKeys:
    """The adapter of a ``CommonRandomNumbers``: the wrapped fitness's adapter, evaluated with shared keys."""

    def __init__(self, inner: Fitness, shared_by: str):
        self.inner, self.shared_by = inner, shared_by
        self.on_host, self.stateful = inner.on_host, inner.stateful

    def __hash__(self) -> int:
        return hash((SharedKeys, self.inner, self.shared_by))

    def __eq__(self, other) -> bool:
        return isinstance(other, SharedKeys) and (self.inner, self.shared_by) == (other.inner, other.shared_by)

    def initial_state(self) -> PyTree:
        return self.inner.initial_state()

    def update_state(self, fitness_state: PyTree, stats: PyTree) -> PyTree:
        return self.inner.update_state(fitness_state, stats)

    def check(self, params: PyTree, key: jax.Array, fitness_state: PyTree, popsize: int) -> None:
        self.inner.check(params, key, fitness_state, popsize)

    def default_eval_batch_size(self, popsize: int, antithetic: bool, dim: int) -> int:
        return self.inner.default_eval_batch_size(popsize, antithetic, dim)

    def evaluate(self, members, chunk: jax.Array, fitness_state: PyTree, pairs: bool, shared_by: str = "member"):
        del shared_by  # ours
        return self.inner.evaluate(members, chunk, fitness_state, pairs, self.shared_by)

    def evaluate_host(self, generation, members, seeds, params, fitness_state):
        return self.inner.evaluate_host(generation, members, seeds, params, fitness_state)

    def close(self) -> None:
        self.inner.close()


def adapter(fitness_fn, where: str = "fitness_fn") -> Fitness:
    """The engine's adapter (an ``es.fitness.Fitness``) for what the user passed as the fitness.

    An adapter (``es.HostFitness`` is its own) is returned as it is; a JAX
    fitness function or an ``es.StatefulFitness`` is wrapped in a
    ``JaxFitness``; ``es.CommonRandomNumbers`` gives its fitness's adapter
    with shared keys (``SharedKeys``).
    """
    if isinstance(fitness_fn, Fitness):
        return fitness_fn
    if isinstance(fitness_fn, CommonRandomNumbers):
        check_shared_by("es.CommonRandomNumbers", fitness_fn.shared_by)
        if isinstance(fitness_fn.fitness, CommonRandomNumbers):
            raise TypeError(f"{where}: es.CommonRandomNumbers wraps another es.CommonRandomNumbers; wrap the fitness once.")
        return SharedKeys(adapter(fitness_fn.fitness, f"es.CommonRandomNumbers({where})"), fitness_fn.shared_by)
    if not callable(fitness_fn):
        raise TypeError(
            f"{where} must be callable as fitness_fn(params, key) -> scalar, an es.StatefulFitness or an "
            f"es.HostFitness, got {type(fitness_fn).__name__}."
        )
    return JaxFitness(fitness_fn)


class JaxFitness:
    """The adapter of a JAX fitness function or ``es.StatefulFitness``: traced into the generation.

    Hashable (a static argument of ``jax.jit``): two adapters are equal when
    they wrap the same function (bound methods of the same object count as
    the same), whether or not the function itself is hashable, so repeated
    ``evolve`` calls reuse one compilation.
    """

    on_host = False
    shared_by = "member"  # each member its own evaluation key (CommonRandomNumbers shares them)

    def __init__(self, fn: Callable):
        self.fn = fn
        owner = getattr(fn, "__self__", None)
        func = getattr(fn, "__func__", None)
        if owner is not None and func is not None:
            self._key = ("method", id(owner), func)
        else:
            try:
                hash(fn)
                self._key = ("fn", fn)
            except TypeError:
                self._key = ("id", id(fn))
        self.stateful = isinstance(fn, StatefulFitness)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other) -> bool:
        return isinstance(other, JaxFitness) and self._key == other._key

    def update_state(self, fitness_state: PyTree, stats: PyTree) -> PyTree:
        return self.fn.update(fitness_state, stats)

    def initial_state(self) -> PyTree:
        """The ``StatefulFitness``'s ``init()``, or ``None`` for a plain fitness function."""
        return self.fn.init() if self.stateful else None

    def check(self, params: PyTree, key: jax.Array, fitness_state: PyTree, popsize: int) -> None:
        del popsize  # a StatefulFitness's update is traced with the generation's stats
        check_fitness_output(self.fn, params, key, fitness_state)

    @staticmethod
    def default_eval_batch_size(popsize: int, antithetic: bool, dim: int) -> int:
        return default_eval_batch_size(popsize, dim, antithetic)

    @staticmethod
    def evaluate_host(generation, members, seeds, params, fitness_state):
        """Not on the host: a JAX fitness is traced into the generation (``evaluate``)."""
        raise TypeError("a JAX fitness is evaluated inside the compiled generation, not on the host.")

    @staticmethod
    def close() -> None:
        """Nothing to release."""

    def evaluate_one(self, params: PyTree, key: jax.Array, fitness_state: PyTree):
        """``(fitness, stats)`` of one member, the fitness in the fitness dtype."""
        if self.stateful:
            fitness, stats = self.fn.evaluate(params, key, fitness_state)
        else:
            fitness, stats = self.fn(params, key), ()
        return jnp.asarray(fitness, fitness_dtype()), stats

    def evaluate(self, members, chunk: jax.Array, fitness_state: PyTree, pairs: bool, shared_by: str = "member"):
        """``(Fitnesses, stats)`` of the members ``chunk``, by one vmapped call (exact: no residual)."""
        params, params_axes = members.fitness_inputs(chunk, pairs)
        keys = members.eval_keys(chunk, shared_by)
        with jax.named_scope("es_fitness"):
            values, stats = jax.vmap(self.evaluate_one, in_axes=(params_axes, 0, None))(params, keys, fitness_state)
        return Fitnesses(values), stats


class GivenFitness:
    """Fitnesses that are given: evaluation reads them instead of calling a function.

    ``es.tell`` gives the whole population's ``Fitnesses`` (``first=0``), so
    the engine runs the same generation step as ``es.evolve`` without building
    the member params. ``es.evolve_many`` gives, for one run, this device's
    share (members ``first, first + 1, ...``), evaluated together with every
    other run's, with their per-member ``stats`` and the adapter whose
    ``update`` folds them into the state. Holds traced arrays, so it lives
    only inside a compiled function (it is not an ``adapter`` result).
    """

    on_host = False
    shared_by = "member"

    def __init__(self, values: Fitnesses, stats: PyTree = (), first: jax.Array | int = 0, fitness: Any = None):
        self.values, self.stats, self.first, self.fitness = values, stats, first, fitness
        self.stateful = fitness is not None and fitness.stateful

    @staticmethod
    def default_eval_batch_size(popsize: int, antithetic: bool, dim: int) -> int:
        """The whole population: reading given values needs no memory per member, so one batch (no loop)."""
        del antithetic, dim
        return popsize

    def evaluate(self, members, chunk: jax.Array, fitness_state: PyTree, pairs: bool, shared_by: str = "member"):
        del members, fitness_state, pairs, shared_by
        index = chunk - self.first
        return jax.tree.map(lambda v: v[index], self.values), jax.tree.map(lambda s: s[index], self.stats)

    def update_state(self, fitness_state: PyTree, stats: PyTree) -> PyTree:
        """The fitness's update of its state with this generation's stats (stateful only)."""
        return self.fitness.update_state(fitness_state, stats)


def unbindable(fn: Callable, count: int) -> inspect.Signature | None:
    """``fn``'s signature where it cannot take ``count`` positional arguments; ``None`` where it can, or where
    Python cannot read it (some builtins: left to the call)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*range(count))
    except TypeError:
        return signature
    return None


def check_takes_params_and_key(fn: Callable) -> None:
    """Raise ``TypeError`` naming the fix when ``fn``'s signature cannot take ``(params, key)``."""
    signature = unbindable(fn, 2)
    if signature is not None:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise TypeError(
            f"fitness_fn {name}{signature} must take (params, key): one member's params and a PRNG key; "
            f"a fitness that needs no key can ignore it, e.g. def {name}(params, key): ..."
        )


def check_fitness_output(fn: Callable, params: PyTree, key: jax.Array, fitness_state: PyTree):
    """Trace ``fn`` on abstract inputs and raise ``TypeError`` unless it gives a real scalar."""
    if isinstance(fn, StatefulFitness):
        out = traced(fn.evaluate, "StatefulFitness.evaluate(params, key, fitness_state)", params, key, fitness_state)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(
                "StatefulFitness.evaluate must return (fitness, stats); got "
                f"{jax.tree.map(lambda x: x.shape, out)}."
            )
        out = out[0]
        where = "StatefulFitness.evaluate(params, key, fitness_state)[0]"
    else:
        check_takes_params_and_key(fn)
        where = "fitness_fn(params, key)"
        out = traced(fn, where, params, key)
    if not isinstance(out, jax.ShapeDtypeStruct) or out.shape != ():
        got = validation.shapes(out)
        raise TypeError(
            f"{where} must return a scalar (shape ()), got {got}. "
            "Reduce it to one number per member, e.g. jnp.sum(rewards) or loss.mean()."
        )
    if not (jnp.issubdtype(out.dtype, jnp.floating) or jnp.issubdtype(out.dtype, jnp.integer)):
        raise TypeError(f"{where} must return a real number, got dtype {out.dtype}.")


_LIBRARIES = (os.path.dirname(os.path.dirname(jax.__file__)) + os.sep,  # site-packages: jax, flax, ...
              os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)  # es itself


def traced(fn: Callable, where: str, *args):
    """``jax.eval_shape(fn, *args)``; an error that ``fn`` raises while traced becomes an ``es.FitnessError``
    naming the call, the line of the user's code it came from, and what a traced fitness may not do."""
    try:
        return jax.eval_shape(fn, *args)
    except Exception as error:  # the user's function failed on abstract (traced) inputs
        frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(_LIBRARIES)]
        at = f" at {frames[-1].filename}:{frames[-1].lineno} ({frames[-1].name})" if frames else ""
        shapes = validation.shapes(args[0])
        raise FitnessError(
            f"{where} raised {type(error).__name__}{at} while es traced it on one member's params {shapes}: "
            f"{error}\nA JAX fitness runs traced, once per program: its Python sees abstract arrays, so branch "
            "with jnp.where or jax.lax.cond rather than `if` on a value; Python or numpy code that needs "
            "concrete values runs on the host with es.HostFitness(fn)."
        ) from None
