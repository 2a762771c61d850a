"""The options of ``tasks.make`` for a gymnax environment, checked and resolved into an ``EnvTask``'s parts.

Option values become hashable ``(name, value)`` pairs (``option_pairs``), ``env_params`` overrides are checked
against and applied to the env's default ``EnvParams``, and the options every environment task shares
(``num_episodes``, ``max_steps``, ``policy``, ``hidden_sizes``) are checked here for ``tasks.envs`` and
``tasks.gym`` alike. From a gymnax env's spaces come the policy's action head (``action_head``, picked by
``action_selection``) and the features it sees (``observation_features``: the feature shape, e.g. ``(4,)`` or
``[H, W, C]`` images, and the number of categories of a one-hot encoded ``Discrete`` observation).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from es import validation
from tasks.policies import BOX_SELECTIONS, DISCRETE_SELECTIONS, BoxHead, DiscreteHead, GaussianHead
from tasks.registry import make_owner

# action_selection=None: the head per (action space, image observations). Sampled actions on images
# (MinAtar): its games are nearly deterministic, so argmax members near a plateau tie (docs/tasks.md).
DEFAULT_SELECTION = {
    ("Discrete", False): "argmax",
    ("Discrete", True): "categorical",
    ("Box", False): "tanh",
    ("Box", True): "tanh",
}


def _freeze(value: Any) -> Any:
    """Lists and arrays -> tuples, so option values can be hashed."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, (np.ndarray, jax.Array)):
        return _freeze(np.asarray(value).tolist())
    return value


def option_pairs(env_id: str, option: str, value: dict | None) -> tuple[tuple[str, Any], ...]:
    """The dict option ``value`` (``env_kwargs``, ``env_params``) as sorted, hashable ``(name, value)`` pairs."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise TypeError(f"tasks.make({env_id!r}, {option}=...): {option} must be a dict, got {type(value).__name__}.")
    pairs = tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    for k, v in pairs:
        try:
            hash(v)
        except TypeError:
            raise TypeError(
                f"tasks.make({env_id!r}, {option}={{{k!r}: ...}}): values must be numbers, strings, "
                f"bools or (nested) lists of them, got {type(v).__name__}."
            ) from None
    return pairs


def override_params(defaults, overrides: tuple[tuple[str, Any], ...]):
    """The env's ``EnvParams`` ``defaults`` with ``overrides`` applied (array fields keep their dtype)."""
    if not overrides:
        return defaults
    values = {}
    for name, value in overrides:
        old = getattr(defaults, name)
        values[name] = jnp.asarray(value, jnp.asarray(old).dtype) if isinstance(old, jax.Array) else value
    return defaults.replace(**values)


def check_env_params(env_id: str, defaults, overrides) -> None:
    """Unknown fields, and numbers of the wrong kind for the default's int or float fields, raise ValueError."""
    valid = [f.name for f in dataclasses.fields(defaults)]
    unknown = sorted(name for name, _ in overrides if name not in valid)
    if unknown:
        raise ValueError(f"tasks.make({env_id!r}, env_params=...): unknown field(s) {unknown}; valid fields: {valid}")
    for name, value in overrides:
        old = getattr(defaults, name)
        if isinstance(old, bool):
            continue  # bools and arrays are passed on as before
        if isinstance(old, numbers.Integral):
            expected, ok = "an int", validation.is_int(value)
        elif isinstance(old, numbers.Real):
            expected, ok = "a real number", validation.is_real(value)
        else:
            continue
        if not ok:
            raise ValueError(
                f"tasks.make({env_id!r}, env_params={{{name!r}: {value!r}}}): field {name!r} of {env_id} "
                f"must be {expected} (default {old!r}), got {type(value).__name__} {value!r}."
            )


def check_hidden_sizes(env_id: str, hidden_sizes, example: str) -> tuple[int, ...]:
    """``hidden_sizes`` as a tuple of ints >= 1 (a tuple or list of them), else a ValueError showing ``example``."""
    if not isinstance(hidden_sizes, (tuple, list)) or any(
        not validation.is_int(h) or h < 1 for h in hidden_sizes
    ):
        raise ValueError(
            f"tasks.make({env_id!r}, hidden_sizes={hidden_sizes!r}): give a tuple of positive ints, {example}."
        )
    return tuple(int(h) for h in hidden_sizes)


def check_episode_options(env_id: str, num_episodes, max_steps, policy, policies) -> tuple[int, int | None, str]:
    """The options every environment task shares: ``(num_episodes, max_steps or None, policy)``, checked."""
    owner = make_owner(env_id)
    return (
        validation.check_int(owner, "num_episodes", num_episodes, minimum=1),
        validation.check_optional_int(owner, "max_steps", max_steps),
        validation.check_choice(owner, "policy", policy, policies),
    )


def is_image(obs_shape: tuple[int, ...], obs_categories: int) -> bool:
    """Whether observations of ``obs_shape`` (``obs_categories`` 0: arrays, not one-hot) are images."""
    return obs_categories == 0 and len(obs_shape) in (2, 3)


def action_head(env_id: str, space, action_selection: str | None, images: bool):
    """The policy head for the action ``space``; ``action_selection=None`` picks the space's default.

    Defaults: ``"argmax"`` for ``Discrete`` actions (``"categorical"`` when the
    observations are images, as in MinAtar: see ``DEFAULT_SELECTION``) and
    ``"tanh"`` for ``Box`` actions.
    """
    import gymnax.environments.spaces as spaces

    if isinstance(space, spaces.Discrete):
        choices, kind = DISCRETE_SELECTIONS, "Discrete"
    elif isinstance(space, spaces.Box):
        choices, kind = BOX_SELECTIONS, "Box"
    else:
        raise TypeError(f"{env_id}: action space {space!r} is not supported (Discrete or Box only).")
    if action_selection is None:
        action_selection = DEFAULT_SELECTION[kind, images]
    elif action_selection not in choices:
        all_choices = [*DISCRETE_SELECTIONS, *BOX_SELECTIONS]
        validation.check_choice(make_owner(env_id), "action_selection", action_selection, all_choices)  # not one at all
        raise ValueError(
            f"tasks.make({env_id!r}, action_selection={action_selection!r}): {env_id} has {kind} actions; "
            f"use one of {list(choices)} (or None for {DEFAULT_SELECTION[kind, images]!r})."
        )
    if kind == "Discrete":
        return DiscreteHead(int(space.n), action_selection)
    shape = tuple(int(s) for s in space.shape)
    low = tuple(float(v) for v in np.broadcast_to(np.asarray(space.low, np.float32), shape).reshape(-1))
    high = tuple(float(v) for v in np.broadcast_to(np.asarray(space.high, np.float32), shape).reshape(-1))
    return GaussianHead(shape, low, high) if action_selection == "gaussian" else BoxHead(shape, low, high)


def observation_features(env_id: str, env, env_params) -> tuple[tuple[int, ...], int]:
    """``(feature shape, obs_categories)`` of the env's observations."""
    import gymnax.environments.spaces as spaces

    space = env.observation_space(env_params)
    if isinstance(space, spaces.Discrete):
        return (int(space.n),), int(space.n)
    obs = jax.eval_shape(lambda k: env.reset(k, env_params)[0], jax.random.key(0))
    if not isinstance(obs, jax.ShapeDtypeStruct):
        raise TypeError(f"{env_id}: observations of type {type(obs).__name__} are not supported (arrays only).")
    return tuple(int(s) for s in obs.shape), 0
