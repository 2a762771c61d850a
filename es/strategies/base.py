"""The strategy contract: what a strategy's author writes, and the state the engine carries.

A strategy is, as in evosax, static configuration apart from traced hyperparameters, and, as in optax,
pure functions over its own NamedTuple state:

- **static configuration**: a frozen dataclass whose fields are the constructor's arguments (``popsize``,
  ``antithetic``, ``maximize``, ``noise`` and the strategy's own settings). It is hashable: a static
  argument of ``jax.jit``. Whatever shapes the compiled program (PGPE's ``sigma_learning_rate == 0``,
  SNES's ``temperature is None``) is decided here, in Python.
- **hyperparameters**: ``hyperparameters(dim)`` returns a NamedTuple of numbers (``sigma``, learning
  rates, a temperature), resolved for ``dim`` parameters. They enter the compiled program as traced
  values: ``es.evolve_many`` ``vmap``s over them and a new value does not recompile. Every ``float``
  field of the dataclass is one; the maths read them from ``hp``, never from ``self`` (in the compiled
  program ``self.sigma`` is a placeholder that refuses arithmetic: ``Strategy.program``).
- **its state**: a NamedTuple. A field annotated ``PerCoordinate[...]`` holds one value per parameter in
  each ``float[D]`` leaf; a field annotated ``Private[...]`` is read by ``update`` only (an optimizer's
  moments), so a device that updates a slice of the coordinates keeps only its slice of it.

and four pure functions on flat vectors (``D`` coordinates, or a slice of ``S`` of them)::

    initial_state(hp, mean)                                  -> state             mean: float[D]
    scale(hp, state, generation)                             -> float[] | float[D] | float[D, D]
    coefficients(hp, state, fitness)                         -> Coefficients      fitness: float[P]
    update(hp, state, mean, coefficients, sums, generation)  -> Step(mean, state, direction, change)

Member ``i`` is ``mean + scale * s_i * eps_i`` (``mean + scale @ (s_i * eps_i)`` for a matrix scale), with
``eps_i`` a unit noise vector rebuilt from shared keys and ``s_i = -1`` for the second member of an
antithetic pair. After the fitnesses are exchanged the strategy turns them into per-member coefficients,
and the engine rebuilds, in chunks and without ever storing the population::

    Sums.linear = sum_i a_i s_i eps_i           float[D]
    Sums.square = sum_i b_i eps_i**2            float[D]     when Coefficients.square is given
    Sums.outer  = sum_i (c_i + u_i / |eps_i|^2) eps_i eps_i^T
                                                float[D, D]  when Coefficients.outer is given
                                                             (u_i: Coefficients.outer_unit, or 0)

A strategy whose ``update`` works coordinate by coordinate declares ``coordinatewise``: given a slice
of the mean, of its per-coordinate state and of the sums, it returns those coordinates of the whole
update, bit for bit, so ``exchange="sharded"`` splits the update over the devices. A strategy may also
say when it should stop (``stop_conditions``, see ``es.engine.stopping``). Everything else (keys, noise,
``shard_map``/``scan``, micro-batches, the exchange, NaN/inf, the best member, norms, metrics) is the
engine's. docs/design.md walks through adding a strategy.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import typing
from typing import Annotated, Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jax.flatten_util import ravel_pytree

from es import validation
from es.engine import stopping
from es.engine.members import compute_dtype
from es.fitness import adapter, fitness_dtype
from es.noise import NoiseSource
from es.strategies import optimizers

PyTree = Any
Schedule = Callable[[jax.Array], jax.Array]

# How a run executes is an argument of es.evolve / es.run, not of the strategy.
EXECUTION_ARGUMENTS = ("exchange", "eval_batch_size", "update_batch_size")


class State(NamedTuple):
    """Everything that changes during a run (a pytree; replicated on every device).

    Attributes:
      params: the mean of the search distribution, same pytree structure as
        the initial params (what you deploy).
      strategy_state: the strategy's own state (``OpenESState``,
        ``SNESState``, ...): optimizer state, per-coordinate scales, paths.
      key: the run key every generation's keys derive from (never changes).
      generation: int32 scalar, generations completed so far.
      best_params: the best member seen so far (same structure as ``params``).
      best_fitness: scalar (float32; float64 under ``jax_enable_x64``), its
        fitness (``-inf``/``+inf`` before any valid member when
        maximizing/minimizing).
      fitness_state: the ``StatefulFitness`` state, or ``None``.
      stop_history: the recent generations' fitnesses that the stopping
        conditions read (``es.engine.stopping.History``), recorded by the
        calls given ``stop_criteria`` (``es.minimize``'s always).
    """

    params: PyTree
    strategy_state: Any
    key: jax.Array
    generation: jax.Array
    best_params: PyTree
    best_fitness: jax.Array
    fitness_state: PyTree = None
    stop_history: Any = None


class Coefficients(NamedTuple):
    """Per-member coefficients of the sums the update needs (``float[popsize]`` each, or ``None``).

    ``linear`` weighs ``s_i * eps_i``, ``square`` weighs ``eps_i**2`` (a
    per-coordinate variance update) and ``outer`` weighs ``eps_i eps_i^T``
    (a full covariance update). ``outer_unit`` (with ``outer``) weighs the
    unit directions' ``eps_i eps_i^T / |eps_i|^2`` in the same sum: active
    CMA-ES's negative weights, which must not grow with a member's length.
    """

    linear: jax.Array
    square: jax.Array | None = None
    outer: jax.Array | None = None
    outer_unit: jax.Array | None = None


class Sums(NamedTuple):
    """``sum_i a_i s_i eps_i``, ``sum_i b_i eps_i**2`` (float[D] in ``ravel_pytree`` order, or a slice) and
    ``sum_i c_i eps_i eps_i^T`` (float[D, D]); ``None`` where the coefficients are."""

    linear: jax.Array
    square: jax.Array | None = None
    outer: jax.Array | None = None


class Step(NamedTuple):
    """What ``update`` returns: the new mean (float[D] or the slice's), the new strategy state, and the
    ascent ``direction`` of the mean and the ``change`` made to it (vectors of the mean's length), whose
    norms the engine reports as ``grad_norm`` and ``update_norm``."""

    mean: jax.Array
    state: Any
    direction: jax.Array
    change: jax.Array


# --------------------------------------------------------------------------- what the state declares

_PER_COORDINATE = "es: one value per coordinate in each float[D] leaf"
_PRIVATE = "es: read by update only; a device updating a slice keeps its slice"


class PerCoordinate:
    """``field: PerCoordinate[jax.Array]`` in a strategy state: every ``float[D]`` leaf of the field holds one
    value per coordinate (SNES's ``sigma``), so an update on a slice of the coordinates gets that slice."""

    def __class_getitem__(cls, kind):
        return Annotated[kind, _PER_COORDINATE]


class Private:
    """``field: Private[optax.OptState]`` in a strategy state: only ``update`` reads the field (an optimizer's
    moments), and its ``float[D]`` leaves hold one value per coordinate. Where ``exchange="sharded"`` splits a
    coordinatewise update, each device keeps only its slice of them between generations."""

    def __class_getitem__(cls, kind):
        return Annotated[kind, _PRIVATE]


@functools.cache
def declared_fields(state_type: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(per_coordinate, private)``: the field names of a strategy state NamedTuple annotated ``PerCoordinate``
    or ``Private`` (a private field's ``float[D]`` leaves are per coordinate too)."""
    if not hasattr(state_type, "_fields"):
        return (), ()
    marked = {}
    for name, annotation in getattr(state_type, "__annotations__", {}).items():
        if isinstance(annotation, typing.ForwardRef):
            annotation = annotation.__forward_arg__
        if isinstance(annotation, str):  # `from __future__ import annotations`: read the marker, not the rest
            found = re.match(r"\s*(?:[\w.]+\.)?(PerCoordinate|Private)\[", annotation)
            marked[name] = ({"PerCoordinate": _PER_COORDINATE, "Private": _PRIVATE}[found.group(1)],) if found else ()
        else:
            marked[name] = getattr(annotation, "__metadata__", ())
    return (tuple(name for name, marks in marked.items() if _PER_COORDINATE in marks),
            tuple(name for name, marks in marked.items() if _PRIVATE in marks))


def added_later(default: Any):
    """A strategy field added after runs were checkpointed with the strategy: ``default`` means "as before",
    and ``describe`` leaves the field out while it holds that value, so those checkpoints still resume."""
    return dataclasses.field(default=default, metadata={"added_later": True})


# --------------------------------------------------------------------------- hyperparameters in the program


class _Traced:
    """What a hyperparameter field holds in ``Strategy.program()``: its value is traced, read it from ``hp``."""

    def __repr__(self) -> str:
        return "<traced>"

    def __eq__(self, other) -> bool:
        return isinstance(other, _Traced)

    def __hash__(self) -> int:
        return hash(_Traced)

    def _refuse(self, *args):
        raise TypeError(
            "a strategy's maths read a hyperparameter from self; in the compiled program every float field "
            "is traced: read it from the hyperparameters (hp.<name>, from hyperparameters(dim)) instead."
        )

    __bool__ = __float__ = __array__ = __jax_array__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __truediv__ = __rtruediv__ = __pow__ = __rpow__ = __neg__ = __lt__ = __gt__ = __le__ = __ge__ = _refuse


TRACED = _Traced()


class Strategy:
    """Base of every strategy: ``init``, ``program``, ``describe`` and the checks they share.

    Subclasses are frozen dataclasses that declare all their fields (their
    signature), call ``check_common`` in ``__post_init__``, and implement
    ``hyperparameters`` and the four maths functions of the module docstring.
    ``coordinatewise`` (default ``False``) and ``stop_conditions`` (default:
    none) are optional.
    """

    coordinatewise: bool = False
    """Whether ``update`` works coordinate by coordinate: no norm, sum or other reduction over coordinates,
    and an optimizer declared coordinatewise (``es.optimizers.coordinatewise``)."""

    def __new__(cls, *args, **kwargs):
        moved = [name for name in EXECUTION_ARGUMENTS if name in kwargs]
        if moved:
            name = moved[0]
            raise TypeError(
                f"{cls.__name__}({name}=...): how a run executes is no longer part of the strategy; "
                f"pass {name}= to es.evolve(...) or es.run(...) instead, e.g. "
                f"es.evolve(strategy, fitness_fn, state, n, mesh=mesh, {name}={kwargs[name]!r})."
            )
        return super().__new__(cls)

    # ----------------------------------------------------------------- checks

    def check_common(self) -> None:
        """Validate (and normalise) ``popsize``, ``sigma``, ``maximize``, ``noise`` and ``antithetic``."""
        name = type(self).__name__
        validation.check_popsize(name, self.popsize)
        configurable = "antithetic" in self.fields()  # else a class constant (PGPE, ARS: always pairs)
        if configurable:
            validation.check_bool(name, "antithetic", self.antithetic)
        if self.antithetic and self.popsize % 2:
            always = "" if configurable else f" ({name} always samples pairs)"
            fix = f"popsize={self.popsize + 1}" + ("" if always else " or antithetic=False")
            raise ValueError(
                f"{name}(popsize={self.popsize}, antithetic=True): antithetic sampling evaluates members "
                f"in +/- pairs{always}, so popsize must be even; use {fix}."
            )
        if not callable(self.sigma):
            self._set("sigma", validation.check_float(name, "sigma", self.sigma, positive=True, example="0.05"))
        validation.check_bool(name, "maximize", self.maximize)
        if not isinstance(self.noise, NoiseSource):
            raise TypeError(
                f"{name}(noise={self.noise!r}): noise must be a noise source: es.GaussianNoise(), "
                "es.NoiseTable(size=..., seed=...), es.LowRankNoise(rank=..., factored=...), or your own "
                "es.noise.NoiseSource."
            )

    def check_noise_fits(self, dim: int = 2) -> None:
        """Refuse a noise source whose coordinates are not independent (low-rank noise) when the strategy's
        update reads ``eps**2`` or ``eps eps^T`` (it returns ``Coefficients.square`` or ``.outer``): a variance
        or covariance update from such noise is unsound. The engine checks it before every run too."""
        if self.noise.independent_coordinates:
            return
        hp = self.hyperparameters(dim)

        def coefficients(mean):
            return self.coefficients(hp, self.initial_state(hp, mean), jnp.zeros((self.popsize,), mean.dtype))

        out = jax.eval_shape(coefficients, jax.ShapeDtypeStruct((dim,), jnp.float32))
        if out.square is not None or out.outer is not None:
            name = type(self).__name__
            raise ValueError(
                f"{name}(noise={self.noise!r}): {name} adapts a variance per coordinate (or a covariance) from the "
                "squared noise, which assumes independent N(0, 1) coordinates; the coordinates of a low-rank "
                "perturbation A @ B.T are not independent, so that update is unsound. Use es.GaussianNoise() or "
                "es.NoiseTable() with this strategy, or low-rank noise with a strategy that adapts only the mean "
                "(es.OpenES, es.ARS, es.PGPE(sigma_learning_rate=0))."
            )

    def _set(self, name: str, value) -> None:
        """Store a normalised value in a frozen field (constructors only)."""
        object.__setattr__(self, name, value)

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """The names of the strategy's constructor arguments."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)

    def describe(self) -> dict:
        """The strategy as JSON data: its name and every setting that can be written down.

        Numbers, strings, bools and noise sources appear as they are; an
        optimizer built by name (``es.optimizers.make``: the defaults, and
        every config's) as its ``{name, ...arguments}``; any other object (an
        optax object you built, a schedule, a shaping callable) as
        ``"<TypeName>"``. ``es.run`` stores it in checkpoints and refuses to
        resume with a strategy described otherwise.
        """
        described = {"name": type(self).__name__}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not field.init or (field.metadata.get("added_later") and value == field.default):
                continue
            if value is None or isinstance(value, (bool, int, float, str)):
                described[field.name] = value
            elif dataclasses.is_dataclass(value) and isinstance(value, NoiseSource):
                described[field.name] = {"name": type(value).__name__, **dataclasses.asdict(value)}
            else:
                described[field.name] = optimizers.description(value) or f"<{type(value).__name__}>"
        return described

    # -------------------------------------------------------- the compiled program

    def hyperparameter_fields(self) -> tuple[str, ...]:
        """The fields traced into the compiled program: every field holding a float."""
        return tuple(f.name for f in dataclasses.fields(self)
                     if isinstance(getattr(self, f.name), float))

    def program(self) -> "Strategy":
        """The static part of the strategy: a copy whose hyperparameter fields hold ``TRACED``.

        Two strategies that differ only in their hyperparameters have equal
        programs: one compilation serves both (``jax.jit``'s static argument),
        and ``es.evolve_many`` runs them in one program. The copy skips the
        constructor (its checks passed for the real values).
        """
        traced = self.hyperparameter_fields()
        if not traced:
            return self
        program = copy.copy(self)
        for name in traced:
            program._set(name, TRACED)
        return program

    # ------------------------------------------------------------------ state

    def init(self, key: jax.Array, params: PyTree, fitness: Any = None) -> State:
        """The state of a new run.

        Args:
          key: a JAX PRNG key (``jax.random.key(seed)`` or ``PRNGKey(seed)``);
            every draw of the run derives from it.
          params: the initial mean, any non-empty pytree of float arrays.
          fitness: the fitness you will evolve with (optional). A
            ``StatefulFitness`` (or a stateful ``HostFitness``) gives the state
            its initial ``fitness_state``; a plain ``fitness_fn(params, key)``,
            a ``HostFitness`` or ``None`` gives ``None``, so
            ``init(key, params, fitness=task.fitness)`` works for either.
        """
        validation.check_key(key)
        validation.check_params(params)  # before any conversion: a leaf JAX cannot hold is named here
        params = jax.tree.map(strongly_typed, params)
        validation.check_finite(params)
        fitness = None if fitness is None else adapter(fitness, f"{type(self).__name__}.init(fitness=...)")
        return initial_state(self, key, params, fitness)

    # --------------------------------------------------------------- the maths

    def hyperparameters(self, dim: int) -> NamedTuple:  # pragma: no cover - interface
        """The traced hyperparameters for ``dim`` parameters (a NamedTuple of float scalars)."""
        raise NotImplementedError

    def initial_state(self, hp: NamedTuple, mean: jax.Array) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    def scale(self, hp: NamedTuple, state: Any, generation: jax.Array) -> jax.Array:  # pragma: no cover
        raise NotImplementedError

    def coefficients(self, hp: NamedTuple, state: Any, fitness: jax.Array) -> Coefficients:  # pragma: no cover
        raise NotImplementedError

    def update(self, hp: NamedTuple, state: Any, mean: jax.Array, coefficients: Coefficients, sums: Sums,
               generation: jax.Array) -> Step:  # pragma: no cover - interface
        raise NotImplementedError

    def stop_conditions(self, hp: NamedTuple, state: Any, mean: jax.Array, generation: jax.Array,
                        criteria) -> dict[str, jax.Array]:
        """The strategy's own stopping conditions met (names of ``es.engine.stopping.CRITERIA`` -> bool
        scalars), read from its state with the thresholds of ``criteria`` (an ``es.StopCriteria``). Default:
        none; the engine adds the conditions every strategy shares (fitness history, a collapsed scale)."""
        del hp, state, mean, generation, criteria
        return {}


def filled(shape: tuple[int, ...], value, dtype) -> jax.Array:
    """``jnp.full(shape, value, dtype)`` for a new state.

    A concrete ``value`` is built in numpy and put on the device: an eager ``jnp.zeros``, ``jnp.full`` or
    ``jnp.asarray`` compiles a small program per shape (jax 0.10), a few for every strategy's first state in
    a fresh process. A traced ``value`` (a state made inside a program) is built by ``jnp``.
    """
    if isinstance(value, jax.core.Tracer):
        return jnp.full(shape, value, dtype)
    return jax.device_put(np.full(shape, value, dtype))


def strongly_typed(x) -> jax.Array:
    """``x`` as a JAX array without JAX's weak type.

    ``jnp.full(n, 0.5)`` and Python floats are weakly typed; the params a run returns are not, and a weak type
    is part of what a compiled program is keyed on: a first state with weakly typed params would make the
    second ``evolve`` call compile the program again. A leaf on no particular device (``jnp.full``'s) is
    rebuilt from the host, which compiles no program; a traced one, or one placed on devices, is converted.
    """
    x = jnp.asarray(x)
    if not jax.typeof(x).weak_type:
        return x
    if isinstance(x, jax.core.Tracer) or x.committed:
        return jax.lax.convert_element_type(x, x.dtype)
    return jax.device_put(np.asarray(x))


def initial_state(strategy: Strategy, key: jax.Array, params: PyTree, fitness) -> State:
    """The ``State`` of a new run of ``strategy`` from ``params`` (``fitness``: an adapter or ``None``)."""
    flat = ravel_pytree(params)[0]
    dim = flat.shape[0]
    hp = strategy.hyperparameters(dim)
    dtype = fitness_dtype()
    return State(
        params=params,
        strategy_state=strategy.initial_state(hp, flat.astype(compute_dtype(flat.dtype))),
        key=key,
        generation=jax.device_put(np.int32(0)),  # host values put, not jnp-built: no program compiled for them
        best_params=params,
        best_fitness=jax.device_put(np.asarray(-np.inf if strategy.maximize else np.inf, dtype)),
        fitness_state=None if fitness is None else fitness.initial_state(),
        stop_history=stopping.initial_history(dim, strategy.popsize, dtype),
    )


def optimizer_field(name: str, **kwargs) -> Any:
    """A dataclass field whose default is the optimizer ``name(**kwargs)`` (optax or ``es.clipup``).

    The default object is ``es.optimizers.make``'s shared one, so strategies
    with the default compare equal (one jit compilation), and ``(name,
    kwargs)`` stay in the field's metadata, where configs read the default from.
    """
    factory = functools.partial(optimizers.make, name, **kwargs)
    return dataclasses.field(default_factory=factory, metadata={"optimizer": {"name": name, **kwargs}})
