"""The strategy interface: what a strategy computes, and the state the engine carries.

A strategy is an immutable description of a search distribution and its
update (a frozen, hashable dataclass: static under ``jax.jit``), written as
four pure functions over its own NamedTuple state, in the style of optax::

    initial_state(params)                -> strategy_state
    scale(strategy_state, generation)    -> float32[] or float32[D]
    coefficients(strategy_state, fitness)-> Coefficients(linear f32[P], square f32[P] | None)
    update(state, coefficients, sums)    -> (params, strategy_state, {"grad_norm": g, "update_norm": u})

``g`` and ``u`` are the ascent direction for the mean and the change made to
it (float32[D] vectors, or pytrees like the params), whose norms the engine
takes in an order that does not depend on the mesh (``es.coordinates.norm``);
a strategy may instead return the norms (scalars) itself.

Every strategy here keeps a diagonal (or isotropic) Gaussian around the mean
``params``. Member ``i`` is ``params + scale * s_i * eps_i`` with ``eps_i`` a
unit noise vector rebuilt from shared keys (``s_i = -1`` for the second member
of an antithetic pair, else ``+1``). After the fitnesses are exchanged the
strategy turns them into per-member coefficients ``a_i`` and ``b_i``, and the
engine rebuilds, in chunks and without ever storing the population::

    Sums.linear = sum_i a_i * s_i * eps_i        float32[D]
    Sums.square = sum_i b_i * eps_i**2           float32[D]  (when the strategy asks for it)

which is all that OpenAI-ES, SNES, PGPE, ARS and sep-CMA-ES need. Everything
else (keys, noise, ``shard_map``/``scan``, micro-batches, the exchange,
NaN/inf handling, the best member, ``StatefulFitness``, metrics) is the
engine's (``es/engine/generation.py``). docs/design.md walks through adding a strategy.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from es.noise import sources as noise_lib
from es import validation

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
      best_fitness: float32 scalar, its fitness (``-inf``/``+inf`` before any
        valid member when maximizing/minimizing).
      fitness_state: the ``StatefulFitness`` state, or ``None``.
    """

    params: PyTree
    strategy_state: Any
    key: jax.Array
    generation: jax.Array
    best_params: PyTree
    best_fitness: jax.Array
    fitness_state: PyTree = None


class Coefficients(NamedTuple):
    """Per-member coefficients of the sums the update needs (``float32[popsize]`` each).

    ``linear`` weighs ``s_i * eps_i`` and ``square`` weighs ``eps_i**2``;
    ``square`` is ``None`` for strategies that adapt only the mean.
    """

    linear: jax.Array
    square: jax.Array | None = None


class Sums(NamedTuple):
    """``sum_i a_i s_i eps_i`` and ``sum_i b_i eps_i**2``, float32[D] in ``ravel_pytree`` order."""

    linear: jax.Array
    square: jax.Array | None = None


class Strategy:
    """Base of every strategy: ``init`` and the checks they share.

    Subclasses are frozen dataclasses that declare all their fields (their
    signature), call ``check_common`` in ``__post_init__`` and implement the
    four maths functions above. Class attributes:

    - ``antithetic``: a field or a class constant; members ``2j, 2j+1`` share
      noise vector ``j`` with signs ``+1, -1``.
    - ``uses_squares``: whether ``coefficients`` returns ``square`` (a
      per-coordinate variance update, unsound with low-rank samples: such a
      strategy refuses a noise source without ``independent_coordinates``).
    - ``switches``: the float fields whose zero switches part of the update
      off (PGPE's ``sigma_learning_rate``). Whether such a field is zero is
      program structure, not a number: the maths asks ``switched_on(name)``,
      which stays a Python bool when ``es.evolve_many`` traces the value, and
      the runs of one sweep must agree on it.
    - ``later_fields``: settings added after runs were checkpointed with the
      strategy, each with the value that means "as before"; ``describe``
      leaves a setting out while it holds that value, so those checkpoints,
      whose description lacks it, still resume.
    - ``coordinatewise``: whether ``update`` works coordinate by coordinate
      (see its property); with ``exchange="sharded"`` the update is then
      split over the devices.
    - ``private_state``: the fields of the strategy's state NamedTuple that
      only ``update`` reads (an optimizer's moments, never ``scale`` or
      ``coefficients``): a coordinatewise update keeps each device's slice
      of them on that device between generations.
    """

    uses_squares: ClassVar[bool] = False
    switches: ClassVar[tuple[str, ...]] = ()
    later_fields: ClassVar[dict[str, Any]] = {}
    private_state: ClassVar[tuple[str, ...]] = ()

    @property
    def coordinatewise(self) -> bool:
        """Whether ``update`` is coordinatewise: default ``False``.

        A coordinatewise ``update``, given a slice of the coordinates (the
        params as a float32 vector of that slice, every per-coordinate leaf
        of the strategy state sliced alike, the same slice of the sums, and
        ``for_slice(D)`` as the strategy), returns those coordinates of the
        whole update, bit for bit, and its metrics as vectors of that slice:
        no norm, sum or other reduction over coordinates, and an optimizer
        of the same kind (``es.optimizers.coordinatewise``).
        ``exchange="sharded"`` then has each device update its slice only
        (docs/scaling.md).
        """
        return False

    def for_slice(self, dim: int) -> "Strategy":
        """The strategy that updates a slice of the ``dim`` coordinates: every setting derived from ``dim``
        fixed to its value for all of them (default: ``self``; SNES fixes its sigma learning rate)."""
        del dim
        return self

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
        validation.check_int(name, "popsize", self.popsize, 2, "the update compares members")
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
        if not isinstance(self.noise, noise_lib.NOISE_SOURCES):
            raise TypeError(
                f"{name}(noise={self.noise!r}): noise must be es.GaussianNoise(), "
                "es.NoiseTable(size=..., seed=...) or es.LowRankNoise(rank=..., factored=...)."
            )
        if self.uses_squares and not self.noise.independent_coordinates:
            raise ValueError(
                f"{name}(noise={self.noise!r}): {name} adapts a variance per coordinate from the squared noise "
                "eps**2, which assumes independent N(0, 1) coordinates; the coordinates of a low-rank "
                f"perturbation A @ B.T are not independent, so that update is unsound. {self.low_rank_fix()}"
            )

    def low_rank_fix(self) -> str:
        """How to use low-rank noise instead, for the error that refuses it."""
        return (
            "Use es.GaussianNoise() or es.NoiseTable() with this strategy, or low-rank noise with a strategy "
            "that adapts only the mean (es.OpenES, es.ARS, es.PGPE(sigma_learning_rate=0))."
        )

    def check_run(self, dim: int) -> None:
        """Checks that need the number of parameters, run by ``es.evolve`` before compiling (default: none)."""
        del dim

    def _set(self, name: str, value) -> None:
        """Store a normalised value in a frozen field (constructors only)."""
        object.__setattr__(self, name, value)

    def describe(self) -> dict:
        """The strategy as JSON data: its name and every setting that can be written down.

        Numbers, strings, bools and noise sources appear as they are; an
        optimizer built by name (``es.optimizers.make``: the defaults, and
        every config's) as its ``{name, ...arguments}``; any other object (an
        optax object you built, a schedule, a shaping callable) as
        ``"<TypeName>"``. ``es.run`` stores it in checkpoints and refuses to
        resume with a strategy described otherwise.
        """
        from es.strategies import optimizers

        described = {"name": type(self).__name__}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in self.later_fields and value == self.later_fields[field.name]:
                continue
            if value is None or isinstance(value, (bool, int, float, str)):
                described[field.name] = value
            elif isinstance(value, noise_lib.NOISE_SOURCES):
                described[field.name] = {"name": type(value).__name__, **dataclasses.asdict(value)}
            else:
                described[field.name] = optimizers.description(value) or f"<{type(value).__name__}>"
        return described

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """The names of the strategy's constructor arguments."""
        return tuple(f.name for f in dataclasses.fields(cls))

    # -------------------------------------------------------- hyperparameters

    def hyperparameters(self) -> dict[str, float]:
        """The numeric hyperparameters: every field that holds a float (``sigma``, learning rates, ...).

        These are the settings in which the runs of ``es.evolve_many`` may
        differ: it passes them into the compiled program as traced float32
        values (``with_hyperparameters``), so one compilation serves every
        value. ``int`` fields (``popsize``, ``top_k``), booleans, choices,
        schedules and noise sources shape the program and are not listed. A
        switch (``switches``) is listed: its value is traced, while whether it
        is zero stays static (``switched_on``).
        """
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), float)}

    def switched_on(self, name: str) -> bool:
        """Whether the switch ``name`` (one of ``switches``) is on, i.e. the field is non-zero: a Python bool.

        On a copy from ``with_hyperparameters`` it is the answer of the
        strategy the copy was made from (the Python float), so a traced value
        never decides the program's structure.
        """
        if name not in self.switches:
            raise ValueError(f"{type(self).__name__}.switched_on({name!r}): the switches are {list(self.switches)}.")
        recorded = self.__dict__.get("_switched_on")
        return recorded[name] if recorded is not None else getattr(self, name) != 0

    def switch_settings(self) -> dict[str, bool]:
        """``{name: switched_on(name)}`` for every switch: what of the numbers shapes the compiled program."""
        return {name: self.switched_on(name) for name in self.switches}

    def with_hyperparameters(self, values: dict[str, jax.Array]) -> "Strategy":
        """A copy of the strategy holding ``values`` (arrays, usually traced) in those fields.

        Only for use inside traced code (``es.evolve_many`` calls it inside
        its ``vmap``): the copy skips the constructor, whose checks already
        passed for the Python floats the values stand for, and it is neither
        hashable nor a valid static argument. The maths of every strategy
        must therefore work with array-valued hyperparameters (``jnp``
        arithmetic only, no Python ``float()``/``math`` on them); what a value
        decides about the program's structure it reads from
        ``switched_on``, which the copy keeps from ``self``.
        """
        unknown = set(values) - set(self.hyperparameters())
        if unknown:
            raise ValueError(
                f"{type(self).__name__}.with_hyperparameters: {sorted(unknown)} are not numeric hyperparameters of "
                f"this strategy; they are {sorted(self.hyperparameters())}."
            )
        replaced = copy.copy(self)  # no __init__, so no __post_init__ checks on the arrays
        replaced._set("_switched_on", self.switch_settings())  # structure stays decided by the Python floats
        for name, value in values.items():
            replaced._set(name, value)
        return replaced

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
        params = jax.tree.map(jnp.asarray, params)
        validation.check_params(params)
        from es.fitness import adapter  # the contract rewrite removes this

        fitness = None if fitness is None else adapter(fitness, f"{type(self).__name__}.init(fitness=...)")
        worst = -jnp.inf if self.maximize else jnp.inf
        return State(
            params=params,
            strategy_state=self.initial_state(params),
            key=key,
            generation=jnp.zeros((), jnp.int32),
            best_params=params,
            best_fitness=jnp.asarray(worst, jnp.float32),
            fitness_state=None if fitness is None else fitness.initial_state(),
        )

    # --------------------------------------------------------------- the maths

    def initial_state(self, params: PyTree) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    def scale(self, strategy_state: Any, generation: jax.Array) -> jax.Array:  # pragma: no cover
        raise NotImplementedError

    def coefficients(self, strategy_state: Any, fitness: jax.Array) -> Coefficients:  # pragma: no cover
        raise NotImplementedError

    def update(self, state: State, coefficients: Coefficients, sums: Sums):  # pragma: no cover
        raise NotImplementedError


def better(fitness: jax.Array, maximize: bool) -> jax.Array:
    """float32 fitnesses where higher is better (negated when minimising)."""
    fitness = jnp.asarray(fitness, jnp.float32)
    return fitness if maximize else -fitness


def optimizer_field(name: str, **kwargs) -> Any:
    """A dataclass field whose default is the optimizer ``name(**kwargs)`` (optax or ``es.clipup``).

    The default object is ``es.optimizers.make``'s shared one, so strategies
    with the default compare equal (one jit compilation), and ``(name,
    kwargs)`` stay in the field's metadata, where configs read the default from.
    """
    from es.strategies import optimizers

    factory = functools.partial(optimizers.make, name, **kwargs)
    return dataclasses.field(default_factory=factory, metadata={"optimizer": {"name": name, **kwargs}})
