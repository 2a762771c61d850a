"""Argument checks, one small helper per kind of value, run once at the edge.

Constructors (the strategies, noise sources, ``es.clipup``) and entry points
(``es.evolve``, ``es.run``, ``es.ask``/``es.tell``) call these before anything
is traced or compiled. Every helper raises ``TypeError`` for a value of the
wrong kind and ``ValueError`` for a value out of range, with a message that
names the call, the argument and the fix::

    SNES(popsize=1): popsize must be at least 2 (the update compares members).

Values that are JAX arrays (the traced hyperparameters of ``es.evolve_many``,
or ``optax.inject_hyperparams`` calling a factory with arrays) are accepted as
they are: they were checked when they were Python numbers.
"""

from __future__ import annotations

import difflib
import math
import numbers
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np
import optax

PyTree = Any


def shapes(tree) -> Any:
    """``tree`` with each array (or ``jax.ShapeDtypeStruct``) as ``"dtype[shape]"``, e.g. ``float32[3]``, for messages."""
    return jax.tree.map(lambda x: f"{x.dtype}{list(x.shape)}", tree)


def is_int(x) -> bool:
    """Whether ``x`` is an integer (Python or numpy) and not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x) -> bool:
    """Whether ``x`` is a real number (Python or numpy) and not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def real_dtype(dtype) -> bool:
    """Whether ``dtype`` holds real numbers: a numpy float or integer dtype (not bool, not complex)."""
    return np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer)


def _traced(x) -> bool:
    return isinstance(x, jax.Array)


def call(owner: str, name: str, value) -> str:
    """How a message names the bad argument: ``es.OpenES(sigma=-1.0)``; an ``owner`` that already shows its
    leading arguments, ``"tasks.make('CartPole-v1')"``, gets the option added: ``tasks.make('CartPole-v1',
    num_episodes=0)``."""
    if owner.endswith(")"):
        return f"{owner[:-1]}, {name}={value!r})"
    return f"{owner}({name}={value!r})"


def check_int(owner: str, name: str, value, minimum: int | None = None, why: str = "") -> int:
    """``value`` as an int; ``minimum`` is inclusive. ``why`` explains the bound."""
    if not is_int(value):
        raise TypeError(f"{call(owner, name, value)}: {name} must be an int{_at_least(minimum)}.")
    if minimum is not None and value < minimum:
        because = f" ({why})" if why else ""
        raise ValueError(f"{call(owner, name, value)}: {name} must be at least {minimum}{because}.")
    return int(value)


# The largest population a run may have. Members are numbered by int32 indices (their noise, their slot in
# the fitness vector), and the engine combines two indices (an antithetic pair's, an offset) without
# overflow up to here; a larger population cannot run by construction (its fitness vector alone would
# take 4 GiB per float32 array).
MAX_POPSIZE = 2**30


def check_popsize(owner: str, value, minimum: int = 2) -> int:
    """``value`` as a population size: an int in ``[minimum, MAX_POPSIZE]``; checks only the number (no array)."""
    popsize = check_int(owner, "popsize", value, minimum, "the update compares members")
    if popsize > MAX_POPSIZE:
        raise ValueError(
            f"{call(owner, 'popsize', value)}: popsize must be at most {MAX_POPSIZE:,} (2**30): members are "
            "numbered by int32 indices. Split a larger population into several runs (es.evolve_many)."
        )
    return popsize


def check_optional_int(owner: str, name: str, value, minimum: int = 1) -> int | None:
    """``None`` (automatic) or an int >= ``minimum``."""
    if value is None:
        return None
    if not is_int(value) or value < minimum:
        raise ValueError(
            f"{call(owner, name, value)}: {name} must be an int >= {minimum}, or None (automatic)."
        )
    return int(value)


def _at_least(minimum) -> str:
    return "" if minimum is None else f" >= {minimum}"


def check_float(
    owner: str,
    name: str,
    value,
    *,
    positive: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
    example: str = "",
) -> float:
    """``value`` as a finite float: ``> 0`` when ``positive``, within ``[minimum, maximum]`` otherwise."""
    if _traced(value):
        return value
    bound = _bound_text(positive, minimum, maximum)
    bound = f" {bound}" if bound else ""
    e_g = f" (e.g. {example})" if example else ""
    if not is_real(value):
        raise TypeError(f"{call(owner, name, value)}: {name} must be a float{bound}{e_g}.")
    number = float(value)
    if not (
        math.isfinite(number)
        and (not positive or number > 0)
        and (minimum is None or number >= minimum)
        and (maximum is None or number <= maximum)
    ):
        raise ValueError(f"{call(owner, name, value)}: {name} must be a finite float{bound}{e_g}.")
    return number


def _bound_text(positive, minimum, maximum) -> str:
    if positive and maximum is not None:
        return f"in (0, {maximum}]"
    if positive:
        return "> 0"
    if minimum is not None and maximum is not None:
        return f"in [{minimum}, {maximum}]"
    if minimum is not None:
        return f">= {minimum}"
    if maximum is not None:
        return f"<= {maximum}"
    return ""


def check_optional_float(owner: str, name: str, value, **bounds) -> float | None:
    """``None`` (automatic) or ``check_float(...)``."""
    return None if value is None else check_float(owner, name, value, **bounds)


def check_bool(owner: str, name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{call(owner, name, value)}: {name} must be True or False.")
    return value


def check_optional_bool(owner: str, name: str, value) -> bool | None:
    """``None`` (automatic) or ``check_bool(...)``."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{call(owner, name, value)}: {name} must be True, False or None (automatic).")
    return value


def closest(word, choices: Iterable) -> str | None:
    """The choice most like ``word`` (``difflib``'s closest match, by ``str``), or ``None``: the "did you mean"
    of every message that refuses an unknown name."""
    matches = difflib.get_close_matches(str(word), [str(choice) for choice in choices], n=1)
    return matches[0] if matches else None


def did_you_mean(word, choices: Iterable) -> str:
    """``" (did you mean 'x'?)"`` with ``closest(word, choices)``, or ``""`` where none is close."""
    match = closest(word, choices)
    return f" (did you mean {match!r}?)" if match else ""


def check_choice(owner: str, name: str, value, choices: Iterable[str]) -> str:
    choices = list(choices)
    if not isinstance(value, str) or value not in choices:
        hint = did_you_mean(value, choices) if isinstance(value, str) else ""
        raise ValueError(f"{call(owner, name, value)} is unknown; use one of {choices}{hint}.")
    return value


def check_optimizer(owner: str, name: str, value) -> optax.GradientTransformation:
    if not isinstance(value, optax.GradientTransformation):
        raise TypeError(
            f"{call(owner, name, value)}: {name} must be an optax.GradientTransformation, "
            "e.g. optax.adam(1e-2) or es.clipup(0.15, max_speed=0.3)."
        )
    return value


def check_key(key) -> None:
    """Raise ``TypeError`` unless ``key`` is a single JAX PRNG key."""
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape == ():
        return
    if isinstance(key, jax.Array) and key.dtype == jnp.uint32 and key.shape == (2,):
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
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        try:
            dtype = jnp.result_type(leaf)
        except TypeError:  # a string, an object: JAX's own error names neither the argument nor the fix
            raise TypeError(
                f"{name}{jax.tree_util.keystr(path)} is {type(leaf).__name__} {leaf!r:.60}, not an array of "
                "numbers; give float arrays (e.g. jnp.zeros(100)) or a pytree of them."
            ) from None
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(
                f"{name}{jax.tree_util.keystr(path)} has dtype {dtype}; ES perturbs "
                "floating-point arrays only. Cast it (x.astype(jnp.float32)) or close over "
                "it in fitness_fn instead."
            )


def check_finite(params: PyTree, name: str = "params",
                 fix: str = "Start from finite params: a fresh init, or the last good checkpoint.") -> None:
    """Raise where a concrete leaf of ``params`` holds NaN or inf, naming it as ``name`` and saying ``fix`` (read
    on the host: no program is compiled; traced leaves, and arrays spread over other processes, are left alone)."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if isinstance(leaf, jax.core.Tracer) or (isinstance(leaf, jax.Array) and not leaf.is_fully_addressable):
            continue
        values = np.asarray(leaf)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise ValueError(
                f"{name}{jax.tree_util.keystr(path)} holds {bad.size} NaN or inf value(s) (the first at flat index "
                f"{bad[0]}: {values.ravel()[bad[0]]}); every member would be invalid. {fix}"
            )


def tree_difference(got: PyTree, expected: PyTree) -> str | None:
    """The first leaf (path, shape, dtype) where two pytrees differ, in words; ``None`` when they agree."""
    got_leaves = jax.tree_util.tree_flatten_with_path(got)[0]
    expected_leaves = jax.tree_util.tree_flatten_with_path(expected)[0]
    if jax.tree.structure(got) != jax.tree.structure(expected):
        got_paths = [jax.tree_util.keystr(p) for p, _ in got_leaves]
        expected_paths = [jax.tree_util.keystr(p) for p, _ in expected_leaves]
        return f"its leaves are {got_paths[:4]}{'...' if len(got_paths) > 4 else ''}, expected {expected_paths[:4]}"
    for (path, a), (_, b) in zip(got_leaves, expected_leaves):
        a_sig = (tuple(jnp.shape(a)), jnp.result_type(a))
        b_sig = (tuple(jnp.shape(b)), jnp.result_type(b))
        if a_sig != b_sig:
            return (
                f"{jax.tree_util.keystr(path) or 'the leaf'} is {a_sig[1]}{list(a_sig[0])}, "
                f"expected {b_sig[1]}{list(b_sig[0])}"
            )
    return None


def check_float_or_schedule(owner: str, name: str, value, example: str) -> Any:
    """A float > 0 (returned as a float) or a callable schedule (checked by ``check_schedule``)."""
    if callable(value):
        return value
    if not is_real(value):
        raise TypeError(
            f"{call(owner, name, value)}: {name} must be a float > 0 (e.g. {example}) or a callable "
            "schedule generation -> value (e.g. optax.exponential_decay(0.1, 100, 0.5))."
        )
    return check_float(owner, name, value, positive=True, example=f"{example}, or a schedule generation -> {name}")


def check_schedule(owner: str, name: str, schedule) -> None:
    """A schedule must map an int32 scalar generation to a float scalar (checked by tracing it)."""
    if not callable(schedule):
        return
    fix = "a schedule must return one float per generation, e.g. optax.exponential_decay(0.1, 100, 0.5)"
    where = call(owner, name, schedule)
    try:
        out = jax.eval_shape(lambda g: jnp.asarray(schedule(g)), jax.ShapeDtypeStruct((), jnp.int32))
    except Exception as error:  # whatever tracing the user's schedule raises
        raise TypeError(
            f"{where}: calling the {name} schedule on an int32 scalar generation failed "
            f"({type(error).__name__}: {error}); {fix}."
        ) from error
    if out.shape != () or not jnp.issubdtype(out.dtype, jnp.floating):
        raise TypeError(
            f"{where}: the {name} schedule returns {out.dtype}{list(out.shape)} for an int32 scalar generation, "
            f"not a float scalar; {fix}."
        )
