"""One config value checked against its field (``config_schema.Field``): its kind, a schedule's or an
optimizer's arguments, a noise source's keys. Every mistake is a ``ConfigError`` naming the key and the fix."""

from __future__ import annotations

import inspect
import numbers
from typing import Any, Callable

from experiments.config_schema import (
    NOISE_NAMES, ConfigError, Field, noise_class, noise_defaults, optimizer_names, schedule_names, suggest,
)


def _type_name(value) -> str:
    return "null" if value is None else type(value).__name__


def check_value(where: str, field: Field, value: Any) -> Any:
    """``value`` of key ``where`` checked against ``field``'s kind (a schedule's, an optimizer's or a noise
    source's arguments too) and normalised (an int as ``int``, a noise name as its mapping); else a
    ``ConfigError`` naming ``where``."""
    kind = field.kind
    if kind in ("int", "optional_int"):
        if value is None and kind == "optional_int":
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            null = " or null" if kind == "optional_int" else ""
            raise ConfigError(f"{where} must be an int{null} ({field.help}), got {value!r} ({_type_name(value)}).")
        return int(value)
    if kind == "float" or (kind == "optional_float" and value is not None):
        return _check_float(where, value, field.help)
    if kind == "optional_float":
        return None
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false ({field.help}), got {value!r}.")
        return value
    if kind == "choice":
        if isinstance(value, str) and field.accepts is not None and field.accepts(value):
            return value
        choices = field.choices()
        if not isinstance(value, str) or value not in choices:
            raise ConfigError(f"{where}: {value!r} is not valid; valid choices: {choices}{suggest(value, choices)}")
        return value
    if kind == "mapping":
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping ({field.help}), got {value!r}.")
        return value
    if kind == "schedule":
        if isinstance(value, dict):
            return _check_schedule(where, value)
        return _check_float(where, value, field.help)
    if kind == "optimizer":
        return _check_optimizer(where, value)
    if kind == "noise":
        return _check_noise(where, value)
    raise AssertionError(kind)


def _check_float(where: str, value: Any, help: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{where} must be a number ({help}), got {value!r} ({_type_name(value)}).")
    return float(value)


def _check_schedule(where: str, value: dict) -> dict:
    names = schedule_names()
    if "schedule" not in value:
        raise ConfigError(f"{where} is a mapping without 'schedule'; name one of {names}, e.g. "
                          f"{{schedule: cosine_decay, init_value: 1.0, decay_steps: 1000}}.")
    name = value["schedule"]
    if name not in names and not (isinstance(name, str) and name.removesuffix("_schedule") in names):
        raise ConfigError(f"{where}.schedule: unknown schedule {name!r}; valid schedules: {names}{suggest(name, names)}")
    factory = schedule_factory(name)
    kwargs = {k: v for k, v in value.items() if k != "schedule"}
    _bind(f"{where}", f"optax.{factory.__name__}", factory, kwargs)
    return value


def schedule_factory(name: str) -> Callable:
    import optax

    base = name.removesuffix("_schedule")
    return getattr(optax.schedules, base + "_schedule", None) or getattr(optax.schedules, base)


def _check_optimizer(where: str, value: Any) -> dict:
    names = optimizer_names()
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict) or "name" not in value:
        raise ConfigError(f"{where} must be a mapping {{name: OPTIMIZER, ...its arguments}} with OPTIMIZER one of "
                          f"{names}, got {value!r}.")
    name = value["name"]
    if name not in names:
        raise ConfigError(f"{where}.name: unknown optimizer {name!r}; valid optimizers: {names}{suggest(name, names)}")
    kwargs = {k: v for k, v in value.items() if k != "name"}
    from es.strategies import optimizers

    factory = optimizers.factory(name)
    _bind(where, f"{factory.__module__.split('.')[0]}.{name}", factory, kwargs)
    parameters = inspect.signature(factory).parameters
    for key, arg in kwargs.items():
        if isinstance(arg, dict):
            _check_schedule(f"{where}.{key}", arg)
        elif _numeric_argument(parameters[key]) and (isinstance(arg, bool) or not isinstance(arg, numbers.Real)):
            raise ConfigError(f"{where}.{key} must be a number or a schedule {{schedule: NAME, ...}} (an argument "
                              f"of {name}), got {arg!r} ({_type_name(arg)}).")
    return value


def _numeric_argument(parameter: inspect.Parameter) -> bool:
    """Whether an optimizer argument takes a number: it is required (the learning rate) or its default is one."""
    if parameter.default is inspect.Parameter.empty:
        return parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    return isinstance(parameter.default, numbers.Real) and not isinstance(parameter.default, bool)


def _check_noise(where: str, value: Any) -> dict:
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict) or value.get("name") not in NOISE_NAMES:
        raise ConfigError(f"{where} must be one of {list(NOISE_NAMES)}, {{name: table, size: INT, seed: INT}} or "
                          f"{{name: lowrank, rank: INT, factored: BOOL}}, got {value!r}.")
    defaults = noise_defaults(value["name"])
    for key in value:
        if key != "name" and key not in defaults:
            raise ConfigError(f"unknown key '{where}.{key}'; valid keys of {value['name']} noise: "
                              f"{['name', *defaults]}{suggest(key, defaults)}")
    resolved = {"name": value["name"]}
    for key, default in defaults.items():
        kind = "bool" if isinstance(default, bool) else "int"
        resolved[key] = check_value(f"{where}.{key}", Field(kind, default, f"a {kind}"), value.get(key, default))
    build_noise(where, resolved)  # the noise source's own checks, named by key
    return resolved


def build_noise(where: str, resolved: dict):
    kwargs = {key: value for key, value in resolved.items() if key != "name"}
    try:
        return noise_class(resolved["name"])(**kwargs)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{where}: {error}") from None


def _bind(where: str, what: str, factory: Callable, kwargs: dict) -> None:
    signature = inspect.signature(factory)
    arguments = [p.name for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    try:
        signature.bind(**kwargs)
    except TypeError as error:
        raise ConfigError(f"{where}: {what} {error}; its arguments are {arguments}.") from None
