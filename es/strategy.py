"""OpenAI-ES configuration (``OpenES``) and its state (``OpenESState``).

The strategy is a frozen, hashable config: everything about it is static under
``jax.jit``. The state is a pytree of arrays that ``es.evolve`` carries from
generation to generation.

Estimator (Salimans et al. 2017). With mean ``theta``, noise ``eps_i ~ N(0, I)``,
members ``theta + sigma * eps_i`` and shaped fitnesses ``w_i``::

    g = 1 / (popsize * sigma) * sum_i w_i * eps_i        # ascent direction
    theta <- theta + optimizer(-g + weight_decay * theta) # optax minimises

With antithetic sampling the members come in pairs ``+eps_j, -eps_j``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from es import noise as noise_lib
from es import shaping
from es.fitness import StatefulFitness

PyTree = Any
Schedule = Callable[[jax.Array], jax.Array]

EXCHANGE_MODES = ("fitness", "gradient")


class OpenESState(NamedTuple):
    """Everything that changes during a run (a pytree; replicated on every device).

    Attributes:
      params: the current mean, same pytree structure as the initial params.
      opt_state: the optax optimizer state for ``params``.
      key: the run key every generation's keys derive from (never changes).
      generation: int32 scalar, generations completed so far.
      best_params: the best member seen so far (same structure as ``params``).
      best_fitness: float32 scalar, its fitness (``-inf``/``+inf`` before any
        valid member when maximizing/minimizing).
      fitness_state: the ``StatefulFitness`` state, or ``None``.
    """

    params: PyTree
    opt_state: optax.OptState
    key: jax.Array
    generation: jax.Array
    best_params: PyTree
    best_fitness: jax.Array
    fitness_state: PyTree = None


def _default_optimizer() -> optax.GradientTransformation:
    return _DEFAULT_OPTIMIZER


_DEFAULT_OPTIMIZER = optax.adam(1e-2)


def is_int(x) -> bool:
    """Whether ``x`` is an integer (Python or numpy) and not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class OpenES:
    """OpenAI evolution strategy (Salimans et al. 2017).

    Args:
      popsize: members per generation (>= 2; even when ``antithetic``).
      sigma: perturbation scale (> 0), or a schedule ``generation -> sigma``
        such as an ``optax`` schedule.
      optimizer: any ``optax.GradientTransformation``; it receives the
        negated gradient estimate (optax minimises). Default ``adam(1e-2)``.
      antithetic: evaluate pairs ``theta +- sigma * eps`` (halves noise draws
        and reduces variance).
      fitness_shaping: ``"centered_rank"``, ``"z_score"``, ``"raw"`` or a
        callable ``float32[popsize] -> float32[popsize]`` (higher is better).
      weight_decay: L2 coefficient ``c >= 0``; adds ``c * theta`` to the
        gradient handed to the optimizer.
      maximize: whether ``fitness_fn`` is to be maximised.
      noise: where perturbations come from: ``es.GaussianNoise()`` (fresh
        ``jax.random.normal`` draws, default) or ``es.NoiseTable(size,
        seed)`` (slices of a shared table: several times faster, see
        docs/benchmarks.md).
      exchange: ``"fitness"`` (default): devices exchange only the popsize
        fitness scalars and every device rebuilds every perturbation, bit
        identical on any device count. ``"gradient"``: each device sums its
        own members' weighted noise and the params-sized sum is all-reduced;
        less compute per device, more bytes, and float rounding depends on
        the device count.
      eval_batch_size: members each device evaluates together in one vmapped
        micro-batch (devices loop over their share in such batches). It must
        be the same on every mesh for results to be bit-identical across
        device counts. ``None``: the largest divisor of ``popsize / 8`` (so it
        divides every device's share on 1, 2, 4 or 8 devices) whose
        perturbations fit in ``2**19`` floats (2 MiB), even with antithetic
        sampling so that pairs share one noise draw. For meshes of more than
        8 devices set it to at most ``popsize // num_devices``.
      update_batch_size: noise vectors rebuilt per step when forming the
        gradient (the step is one fused loop; nothing is stored). ``None``:
        ``max(16, 2**19 // num_params)``, at most ``2**24 // num_params``.

    Peak memory is ``O((eval_batch_size + update_batch_size) * num_params)``,
    independent of popsize.
    """

    popsize: int
    sigma: float | Schedule = 0.05
    optimizer: optax.GradientTransformation = dataclasses.field(default_factory=_default_optimizer)
    antithetic: bool = True
    fitness_shaping: str | shaping.ShapingFn = "centered_rank"
    weight_decay: float = 0.0
    maximize: bool = True
    noise: noise_lib.GaussianNoise | noise_lib.NoiseTable = noise_lib.GaussianNoise()
    exchange: str = "fitness"
    eval_batch_size: int | None = None
    update_batch_size: int | None = None

    def __post_init__(self):
        if not is_int(self.popsize):
            raise TypeError(f"OpenES(popsize={self.popsize!r}): popsize must be an int, e.g. 256.")
        if self.popsize < 2:
            raise ValueError(
                f"OpenES(popsize={self.popsize}): popsize must be at least 2 "
                "(the gradient estimate compares members)."
            )
        if not isinstance(self.antithetic, bool):
            raise TypeError(f"OpenES(antithetic={self.antithetic!r}): antithetic must be True or False.")
        if self.antithetic and self.popsize % 2:
            raise ValueError(
                f"OpenES(popsize={self.popsize}, antithetic=True): antithetic sampling "
                f"evaluates members in +/- pairs, so popsize must be even; use "
                f"popsize={self.popsize + 1} or antithetic=False."
            )
        if callable(self.sigma):
            pass
        elif isinstance(self.sigma, numbers.Real) and not isinstance(self.sigma, bool):
            if not (math.isfinite(self.sigma) and self.sigma > 0):
                raise ValueError(
                    f"OpenES(sigma={self.sigma!r}): sigma must be a finite float > 0 "
                    "(e.g. 0.05) or a schedule generation -> sigma."
                )
            object.__setattr__(self, "sigma", float(self.sigma))
        else:
            raise TypeError(
                f"OpenES(sigma={self.sigma!r}): sigma must be a float > 0 or a callable "
                "schedule (e.g. optax.exponential_decay(0.1, 100, 0.5))."
            )
        if not isinstance(self.optimizer, optax.GradientTransformation):
            raise TypeError(
                f"OpenES(optimizer={self.optimizer!r}): optimizer must be an "
                "optax.GradientTransformation, e.g. optax.adam(1e-2)."
            )
        if isinstance(self.fitness_shaping, str):
            if self.fitness_shaping not in shaping.SHAPING_METHODS:
                raise ValueError(
                    f"OpenES(fitness_shaping={self.fitness_shaping!r}) is unknown; use one of "
                    f"{sorted(shaping.SHAPING_METHODS)} or a callable fitness -> weights."
                )
        elif not callable(self.fitness_shaping):
            raise TypeError(
                f"OpenES(fitness_shaping={self.fitness_shaping!r}): use one of "
                f"{sorted(shaping.SHAPING_METHODS)} or a callable fitness -> weights."
            )
        if isinstance(self.weight_decay, bool) or not isinstance(self.weight_decay, numbers.Real):
            raise TypeError(f"OpenES(weight_decay={self.weight_decay!r}): weight_decay must be a float >= 0.")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(
                f"OpenES(weight_decay={self.weight_decay!r}): weight_decay is an L2 "
                "coefficient and must be >= 0 (0 disables it)."
            )
        object.__setattr__(self, "weight_decay", float(self.weight_decay))
        if not isinstance(self.maximize, bool):
            raise TypeError(f"OpenES(maximize={self.maximize!r}): maximize must be True or False.")
        if not isinstance(self.noise, noise_lib.NOISE_SOURCES):
            raise TypeError(
                f"OpenES(noise={self.noise!r}): noise must be es.GaussianNoise() or "
                "es.NoiseTable(size=..., seed=...)."
            )
        if self.exchange not in EXCHANGE_MODES:
            raise ValueError(
                f"OpenES(exchange={self.exchange!r}) is unknown; use one of {list(EXCHANGE_MODES)}."
            )
        for name in ("eval_batch_size", "update_batch_size"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 1):
                raise ValueError(
                    f"OpenES({name}={value!r}): {name} must be a positive int or None (automatic)."
                )

    def sigma_at(self, generation: jax.Array) -> jax.Array:
        """Perturbation scale (float32 scalar) of generation ``generation``."""
        sigma = self.sigma(generation) if callable(self.sigma) else self.sigma
        return jnp.asarray(sigma, jnp.float32)

    def init(
        self, key: jax.Array, params: PyTree, fitness: StatefulFitness | Callable | None = None
    ) -> OpenESState:
        """The state of a new run.

        Args:
          key: a JAX PRNG key (``jax.random.key(seed)`` or ``PRNGKey(seed)``);
            every draw of the run derives from it.
          params: the initial mean, any non-empty pytree of float arrays.
          fitness: the fitness you will evolve with (optional). A
            ``StatefulFitness`` gives the state its initial ``fitness_state``;
            a plain ``fitness_fn(params, key)`` or ``None`` gives ``None``, so
            ``init(key, params, fitness=task.fitness)`` works for either.
        """
        check_key(key)
        params = jax.tree.map(jnp.asarray, params)
        check_params(params)
        if fitness is not None and not callable(fitness):
            raise TypeError(
                "OpenES.init(fitness=...) takes the fitness you will evolve with (a StatefulFitness "
                f"or a callable fitness_fn(params, key)) or None, got {type(fitness).__name__}."
            )
        worst = -jnp.inf if self.maximize else jnp.inf
        return OpenESState(
            params=params,
            opt_state=self.optimizer.init(params),
            key=key,
            generation=jnp.zeros((), jnp.int32),
            best_params=params,
            best_fitness=jnp.asarray(worst, jnp.float32),
            fitness_state=fitness.init() if isinstance(fitness, StatefulFitness) else None,
        )


def check_key(key) -> None:
    """Raise ``TypeError`` unless ``key`` is a single JAX PRNG key."""
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape == ():
        return
    if isinstance(key, (jax.Array,)) and key.dtype == jnp.uint32 and key.shape == (2,):
        return
    raise TypeError(
        f"key must be a single JAX PRNG key such as jax.random.key(0), got "
        f"{getattr(key, 'dtype', type(key).__name__)}{list(getattr(key, 'shape', []))}."
    )


def check_params(params: PyTree, name: str = "params") -> None:
    """Raise unless ``params`` is a non-empty pytree of floating-point arrays."""
    leaves = jax.tree.leaves(params)
    if not leaves or sum(math.prod(jnp.shape(x)) for x in leaves) == 0:
        raise ValueError(
            f"{name} is empty: give at least one float array with at least one element "
            "(e.g. jnp.zeros(100))."
        )
    paths = jax.tree_util.tree_flatten_with_path(params)[0]
    for path, leaf in paths:
        dtype = jnp.result_type(leaf)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(
                f"{name}{jax.tree_util.keystr(path)} has dtype {dtype}; ES perturbs "
                "floating-point arrays only. Cast it (x.astype(jnp.float32)) or close over "
                "it in fitness_fn instead."
            )
