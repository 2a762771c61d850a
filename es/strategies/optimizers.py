"""Optimizers for the mean: ``es.clipup``, and every optimizer a config may name.

A strategy's ``optimizer`` is any ``optax.GradientTransformation``; it
receives the negated ascent direction (optax minimises). ``make(name,
**kwargs)`` builds one by name, ``es.clipup`` or an ``optax`` alias, so that
configs and strategy defaults can describe optimizers as data.

``make`` and ``es.clipup`` refuse a negative learning rate (the run would
walk against the ascent direction). An optax transformation built by hand
(``optax.sgd(-0.1)``) is a closure es cannot read, so its sign is the
author's: a negative one makes the run worse generation after generation.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from es import compat, validation

PyTree = Any

# optax optimizers whose update needs more than (updates, state, params) cannot drive ES.
_UNSUPPORTED = {"lbfgs", "polyak_sgd"}


class ClipUpState(NamedTuple):
    """The velocity of ``clipup`` (same structure as the params)."""

    velocity: PyTree


def clipup(learning_rate: float, max_speed: float, momentum: float = 0.9) -> optax.GradientTransformation:
    """ClipUp (Toklu et al. 2020, "ClipUp: a simple and powerful optimizer for distribution-based policy evolution").

    With ``g`` the gradient it receives (of the loss: optax minimises) and
    ``v`` the velocity::

        v <- momentum * v + learning_rate * g / ||g||
        v <- v * min(1, max_speed / ||v||)
        update = -v

    The step length is ``learning_rate`` (with momentum up to
    ``learning_rate / (1 - momentum)``), clipped at ``max_speed``, whatever
    the gradient's scale; the paper recommends ``learning_rate = max_speed / 2``.
    Norms are over the whole params pytree. A zero gradient leaves ``v``
    decaying by ``momentum``.

    Args:
      learning_rate: step added to the velocity per update (> 0).
      max_speed: largest norm of an update (> 0), in params units.
      momentum: velocity decay in ``[0, 1)``.
    """
    validation.check_float("es.clipup", "learning_rate", learning_rate, positive=True, example="0.15")
    validation.check_float("es.clipup", "max_speed", max_speed, positive=True, example="0.3")
    validation.check_float("es.clipup", "momentum", momentum, minimum=0.0, maximum=0.999999, example="0.9")

    def init(params):
        return ClipUpState(jax.tree.map(jnp.zeros_like, params))

    def update(updates, state, params=None):
        del params
        norm = optax.tree.norm(updates)
        unit = jnp.where(norm > 0, 1.0 / jnp.where(norm > 0, norm, 1.0), 0.0)
        velocity = jax.tree.map(lambda v, g: momentum * v + learning_rate * unit * g, state.velocity, updates)
        speed = optax.tree.norm(velocity)
        clip = jnp.minimum(1.0, max_speed / jnp.maximum(speed, jnp.finfo(jnp.float32).tiny))
        velocity = jax.tree.map(lambda v: (v * clip).astype(v.dtype), velocity)
        return jax.tree.map(jnp.negative, velocity), ClipUpState(velocity)

    return optax.GradientTransformation(init, update)


def names() -> list[str]:
    """Every optimizer ``make`` knows: ``clipup`` and the optax aliases (``adam``, ``sgd``, ...)."""
    return sorted(["clipup", *(name for name in compat.optax_aliases() if name not in _UNSUPPORTED)])


def factory(name: str):
    """The function ``make`` calls for ``name``."""
    if name == "clipup":
        return clipup
    if name not in names():
        raise ValueError(f"unknown optimizer {name!r}; use one of {names()}.")
    return getattr(optax, name)


class Optimizer(optax.GradientTransformation):
    """An ``optax.GradientTransformation`` that says what it is.

    Attributes (besides optax's ``init`` and ``update``):
      description: ``{name, ...arguments}`` for one built by ``make`` (what
        checkpoints record), else ``None``.
      coordinatewise: whether its update treats every coordinate on its own
        (no norm or other reduction over the params): declared by ``make``
        for the optax aliases in ``COORDINATEWISE``, or by you with
        ``coordinatewise(optimizer)``.

    Equal (and hashing alike) to any optimizer with the same ``init`` and
    ``update`` functions, as optax transformations are.
    """

    description: dict | None
    coordinatewise: bool


def _declared(optimizer: optax.GradientTransformation, description: dict | None, is_coordinatewise: bool) -> Optimizer:
    declared = Optimizer(optimizer.init, optimizer.update)
    declared.description, declared.coordinatewise = description, is_coordinatewise
    return declared


def make(name: str, **kwargs) -> Optimizer:
    """The optimizer ``name(**kwargs)``, e.g. ``make("adam", learning_rate=0.01)``, as an ``Optimizer``.

    Built once per distinct (hashable) arguments and shared: optax
    transformations are closures that compare by identity, so sharing makes
    two strategies built from the same description equal (one jit
    compilation, not one per object). A negative learning rate is refused
    (the run would climb the loss).
    """
    for argument in ("learning_rate", "max_speed"):
        value = kwargs.get(argument)
        if validation.is_real(value) and value < 0:
            raise ValueError(
                f"es.optimizers.make({name!r}, {argument}={value!r}): a negative {argument} steps against the "
                f"ascent direction (the run would get worse); use a positive value, e.g. {argument}={-value!r}."
            )
    arguments = tuple(sorted(kwargs.items()))
    try:
        hash(arguments)
    except TypeError:  # e.g. a mask dict: build a new one
        return _declared(factory(name)(**kwargs), None, False)
    return _shared(name, arguments)


@functools.lru_cache(maxsize=None)
def _shared(name: str, kwargs: tuple) -> Optimizer:
    optimizer = factory(name)(**dict(kwargs))
    description = {  # a schedule argument is described by its type only
        "name": name,
        **{k: v if isinstance(v, (bool, int, float, str, type(None))) else f"<{type(v).__name__}>" for k, v in kwargs},
    }
    return _declared(optimizer, description, name in COORDINATEWISE and "mask" not in description)


# optax aliases whose update is the same arithmetic on every coordinate (no norm over the params): built by
# `make` (without a mask), they step a slice of the coordinates as they step those coordinates of the whole.
COORDINATEWISE = frozenset({"sgd", "adam", "adamw", "adamax", "adamaxw", "nadam", "nadamw", "amsgrad", "adabelief",
                            "adagrad", "rmsprop", "lion"})


def coordinatewise(optimizer: optax.GradientTransformation) -> Optimizer:
    """``optimizer`` declared coordinatewise: its update treats every coordinate on its own (true of optax's
    ``adam``, ``sgd``, ``rmsprop`` ...; not of anything that takes a norm over the params, such as ClipUp or
    ``clip_by_global_norm``). With ``exchange="sharded"`` the engine then splits the update over the devices,
    each stepping its own slice; a wrong declaration changes the results."""
    validation.check_optimizer("es.optimizers.coordinatewise", "optimizer", optimizer)
    return _declared(optimizer, description(optimizer), True)


def is_coordinatewise(optimizer: optax.GradientTransformation) -> bool:
    """Whether ``optimizer`` is declared coordinatewise (``make``'s aliases in ``COORDINATEWISE``, or
    ``coordinatewise(optimizer)``). Any other optax object is opaque: the engine updates it whole."""
    return bool(getattr(optimizer, "coordinatewise", False))


def description(optimizer: optax.GradientTransformation) -> dict | None:
    """``{name, ...arguments}`` of an optimizer ``make`` built (a strategy default, a config's), else ``None``."""
    return getattr(optimizer, "description", None)
