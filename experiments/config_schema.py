"""What an experiment config may hold: its sections, their keys, each key's kind, default and help.

The ``task`` and ``run`` sections are fixed (``SCHEMA``); the ``strategy`` section is derived from the named
strategy's dataclass (``strategy_schema``): its keys are the constructor's arguments, their defaults the
dataclass defaults, their kinds the annotations, their help the docstring's ``Args:``. experiments/config.py
reads a config against it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import typing
from typing import Any, Callable, NamedTuple


REQUIRED = object()


class ConfigError(ValueError):
    """A config key or value that cannot be used."""


class Field(NamedTuple):
    kind: str  # int, float, bool, optional_int, optional_float, choice, mapping, schedule, optimizer, noise
    default: Any
    help: str
    choices: Callable[[], list[str]] | None = None
    accepts: Callable[[str], bool] | None = None  # a quicker membership test than listing the choices


DEFAULT_STRATEGY = "OpenES"


def _shaping_methods() -> list[str]:
    from es.strategies import shaping

    return sorted(shaping.SHAPING_METHODS)


def strategy_names() -> list[str]:
    import es

    return sorted(es.STRATEGIES)


def _exchange_modes() -> list[str]:
    import es

    return list(es.EXCHANGE_MODES)


def _task_names() -> list[str]:
    import tasks

    return tasks.names()


def _is_task_name(name: str) -> bool:
    import tasks

    return tasks.is_name(name)


def _run_default(name: str) -> Any:
    """The default of ``es.run``'s keyword argument ``name``."""
    import es

    return inspect.signature(es.run).parameters[name].default


SCHEMA: dict[str, dict[str, Field] | None] = {
    "task": {
        "name": Field("choice", REQUIRED, "the task, one of tasks.names()", _task_names, _is_task_name),
        "options": Field("mapping", {}, "keyword options of tasks.make(name, **options)"),
    },
    "strategy": None,  # derived from the strategy's dataclass: strategy_schema(name)
    "run": {
        "generations": Field("int", 200, "total generations"),
        "seed": Field("int", 0, "seed of the initial params and of the run key (es.init_from_seed)"),
        "num_devices": Field("optional_int", None, "devices to shard the population over (null: all that divide popsize)"),
        "segment": Field("int", _run_default("segment"), "generations per compiled call; log, progress and checkpoint after each"),
        "keep_checkpoints": Field("int", _run_default("keep_checkpoints"), "how many of the latest checkpoints to keep"),
        "exchange": Field("choice", _run_default("exchange"), "what crosses devices (es.run's exchange)", _exchange_modes),
        "eval_batch_size": Field("optional_int", _run_default("eval_batch_size"), "members evaluated together (null: automatic)"),
        "update_batch_size": Field("optional_int", _run_default("update_batch_size"), "noise vectors rebuilt together (null: automatic)"),
        "islands": Field("int", 1, "python -m experiments.reproduce: independent runs per seed for run.island_generations, then the best by training fitness goes on (1: off)"),
        "island_generations": Field("int", 0, "generations the islands train before one is kept (with run.islands > 1)"),
        "sigma_after_islands": Field("optional_float", None, "the kept island goes on with this strategy.sigma, its strategy state restarted at it (with run.islands > 1; null: as it was)"),
    },
}

# YAML names of the noise sources.
NOISE_NAMES = {"prng": "GaussianNoise", "table": "NoiseTable", "lowrank": "LowRankNoise"}


def noise_class(name: str):
    import es

    return getattr(es, NOISE_NAMES[name])


def noise_defaults(name: str) -> dict:
    """The noise source's constructor arguments and their defaults (from its dataclass)."""
    return {f.name: f.default for f in dataclasses.fields(noise_class(name))}


def noise_config(noise) -> dict:
    """The YAML form of a noise source object."""
    name = next(key for key, cls in NOISE_NAMES.items() if type(noise).__name__ == cls)
    return {"name": name, **dataclasses.asdict(noise)}


@functools.lru_cache(maxsize=None)
def strategy_schema(name: str) -> dict[str, Field]:
    """The ``strategy`` section for ``es.STRATEGIES[name]``: ``name`` and the dataclass's fields."""
    import es

    cls = es.STRATEGIES[name]
    hints = typing.get_type_hints(cls)
    helps = _argument_help(cls)
    fields = {"name": Field("choice", DEFAULT_STRATEGY, "the strategy, one of es.STRATEGIES", strategy_names)}
    for field in dataclasses.fields(cls):
        if not field.init:  # derived from the settings (PGPE's adapts_sigma): not a key of the config
            continue
        kind, choices = _kind(cls, field.name, hints[field.name])
        if "optimizer" in field.metadata:
            default = dict(field.metadata["optimizer"])
        elif field.default is dataclasses.MISSING:
            default = REQUIRED
        elif kind == "noise":
            default = noise_config(field.default)
        else:
            default = field.default
        fields[field.name] = Field(kind, default, helps.get(field.name, field.name), choices)
    return fields


def _kind(cls, name: str, hint) -> tuple[str, Callable[[], list[str]] | None]:
    """The YAML kind of a strategy field, from its type annotation."""
    import optax

    import es

    args = set(typing.get_args(hint)) or {hint}
    none = type(None)
    simple = {bool: "bool", int: "int", float: "float"}
    if hint in simple:
        return simple[hint], None
    if args == {int, none}:
        return "optional_int", None
    if args == {float, none}:
        return "optional_float", None
    if float in args:
        return "schedule", None  # float | Schedule
    if str in args:
        return "choice", _shaping_methods  # str | ShapingFn: the shaping methods
    if hint is optax.GradientTransformation:
        return "optimizer", None
    if es.NoiseSource in args:
        return "noise", None
    raise TypeError(f"experiments.config: {cls.__name__}.{name} has no YAML form (type {hint}).")


def _argument_help(cls) -> dict[str, str]:
    """``argument -> first sentence`` from the ``Args:`` section of ``cls``'s docstring."""
    helps, current = {}, None
    lines = inspect.getdoc(cls).splitlines()
    inside = False
    for line in lines:
        if line.strip() == "Args:":
            inside = True
            continue
        if inside and line and not line.startswith(" "):
            break
        match = re.match(r"^  (\w+): (.*)", line) if inside else None
        if match:
            current = match[1]
            helps[current] = match[2]
        elif inside and current and line.strip():
            helps[current] += " " + line.strip()
    return {name: text.split(". ")[0].rstrip(".") for name, text in helps.items()}


def section_fields(section: str, values: dict | None = None) -> dict[str, Field]:
    """The fields of a config section; the ``strategy`` section's depend on ``values["name"]``."""
    if section == "strategy":
        name = (values or {}).get("name", DEFAULT_STRATEGY)
        if name not in strategy_names():
            choices = strategy_names()
            raise ConfigError(f"strategy.name: {name!r} is not valid; valid choices: {choices}{suggest(name, choices)}")
        return strategy_schema(name)
    return SCHEMA[section]


def optimizer_names() -> list[str]:
    """The optimizers a config may name (``clipup`` and the optax aliases ``adam``, ``sgd``, ...)."""
    from es.strategies import optimizers

    return optimizers.names()


def schedule_names() -> list[str]:
    """The optax schedules a config may name, without their ``_schedule`` suffix."""
    import optax

    names = []
    for name in dir(optax.schedules):
        obj = getattr(optax.schedules, name)
        if inspect.isfunction(obj) and obj.__module__ == "optax.schedules._schedule":
            names.append(name.removesuffix("_schedule"))
    return sorted(names)


def suggest(word: str, choices) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to ``word``, or ``""``."""
    from es import validation

    return validation.did_you_mean(word, choices)
