"""Experiment configs: YAML loading, ``--set`` overrides, validation, and the objects they build.

    task: {name: CartPole-v1, options: {num_episodes: 4}}
    strategy: {name: OpenES, popsize: 256, sigma: 0.05, optimizer: {name: adam, learning_rate: 0.01},
               antithetic: true, fitness_shaping: centered_rank, weight_decay: 0.0, maximize: true}
    run: {generations: 200, seed: 0, num_devices: null, segment: 50, keep_checkpoints: 3, exchange: fitness}

Only ``task.name`` is required; ``resolve`` fills in every default so the
resolved config written to a run directory says everything. A strategy
section without ``popsize`` starts from the task's tuned defaults
(``tasks.default_settings``; ``task_strategy``). The ``strategy`` section is derived from the strategy's own
dataclass (``strategy.name`` is a key of ``es.STRATEGIES``, default OpenES):
its keys are the constructor's arguments, their defaults the dataclass
defaults, their types the annotations. The ``run`` section's execution keys
are ``es.run``'s arguments, with its defaults. A float that the strategy
accepts as a schedule (OpenES's ``sigma``) and any optimizer argument
(``learning_rate``) may also be an optax schedule, ``{schedule: cosine_decay,
init_value: 1.0, decay_steps: 1000, alpha: 0.02}``. ``strategy.noise`` is
``prng`` (fresh N(0, I) draws) or ``{name: table, size: 33554432, seed: 0}``
(a shared noise table).

Every mistake raises ``ConfigError`` (a ``ValueError``) naming the key and the
valid choices, before anything is compiled.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import json
import numbers
import re
import typing
from typing import Any, Callable, NamedTuple

import yaml

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


def _strategy_names() -> list[str]:
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


def _noise_class(name: str):
    import es

    return getattr(es, NOISE_NAMES[name])


def _noise_defaults(name: str) -> dict:
    """The noise source's constructor arguments and their defaults (from its dataclass)."""
    return {f.name: f.default for f in dataclasses.fields(_noise_class(name))}


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
    fields = {"name": Field("choice", DEFAULT_STRATEGY, "the strategy, one of es.STRATEGIES", _strategy_names)}
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
        if name not in _strategy_names():
            choices = _strategy_names()
            raise ConfigError(f"strategy.name: {name!r} is not valid; valid choices: {choices}{_suggest(name, choices)}")
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


# --------------------------------------------------------------------------- YAML


class _Loader(yaml.SafeLoader):
    """YAML 1.1 loader that also reads ``1e-3`` (no dot) as a float, as YAML 1.2 does."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def parse_yaml(text: str, where: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as error:
        raise ConfigError(f"{where} is not valid YAML: {error}") from None


def load(path) -> dict:
    """The raw config in the YAML file ``path``."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as error:
        raise ConfigError(f"cannot read the config file {path}: {error.strerror}") from None
    raw = parse_yaml(text, str(path))
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a mapping with the sections {list(SCHEMA)}, got {type(raw).__name__}.")
    return raw


def dump(config: dict) -> str:
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=None, width=120)


# --------------------------------------------------------------------------- resolve


def _suggest(word: str, choices) -> str:
    from es import validation

    return validation.did_you_mean(word, choices)


def _check_known(section: str, key: str | None = None, context: str = "", values: dict | None = None) -> None:
    """Raise unless ``section`` (and ``section.key``) exist, naming the valid choices."""
    if section not in SCHEMA:
        raise ConfigError(
            f"{context}unknown config section {section!r}; valid sections: {list(SCHEMA)}{_suggest(section, SCHEMA)}"
        )
    fields = section_fields(section, values)
    if key is not None and key not in fields:
        of = f"{section} ({values.get('name', DEFAULT_STRATEGY)})" if section == "strategy" else section
        raise ConfigError(
            f"{context}unknown key '{section}.{key}'; valid keys of {of}: {list(fields)}{_suggest(key, fields)}"
        )


def resolve(raw: dict) -> dict:
    """The full config: ``raw`` checked against ``SCHEMA``, defaults filled in."""
    if not isinstance(raw, dict):
        raise ConfigError(f"the config must be a mapping with the sections {list(SCHEMA)}.")
    for section in raw:
        _check_known(section)
    config = {}
    for section in SCHEMA:
        given = raw.get(section, {})
        if given is None:
            given = {}
        if not isinstance(given, dict):
            raise ConfigError(f"config section {section!r} must be a mapping, got {given!r}.")
        if section == "strategy" and "popsize" not in given:  # the task's defaults, under the keys given
            given = {**task_strategy(config["task"], given.get("name")), **given}
        fields = section_fields(section, given)
        for key in given:
            _check_known(section, key, values=given)
        config[section] = {}
        for key, field in fields.items():
            where = f"{section}.{key}"
            if key in given:
                value = given[key]
            elif field.default is REQUIRED:
                raise ConfigError(f"{where} is required: {field.help}.")
            else:
                value = copy.deepcopy(field.default)
            config[section][key] = _check_value(where, field, value)
    return config


def task_strategy(task: dict, name: str | None = None) -> dict:
    """The strategy section a config without ``strategy.popsize`` starts from: ``tasks.default_settings`` of the
    resolved ``task`` section's task (its recommended strategy, or strategy ``name``'s defaults for it)."""
    import tasks

    if name is not None and name not in _strategy_names():
        return {"name": name}  # section_fields names the choices
    return tasks.default_settings(make_task(task), name)


def with_overrides(raw: dict, overrides: list[str]) -> dict:
    """The resolved config of ``raw`` with ``--set`` ``overrides`` applied. The task's overrides first, so that a
    strategy section without ``popsize`` takes the defaults of the task they name; then all of them on that
    resolved config (so ``strategy.optimizer.learning_rate=...`` sets a key of the resolved default)."""
    task_first = [override for override in overrides if override.split("=", 1)[0].strip().split(".")[0] == "task"]
    return resolve(apply_overrides(resolve(apply_overrides(raw, task_first)), overrides))


def _type_name(value) -> str:
    return "null" if value is None else type(value).__name__


def _check_value(where: str, field: Field, value: Any) -> Any:
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
            raise ConfigError(f"{where}: {value!r} is not valid; valid choices: {choices}{_suggest(value, choices)}")
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
        raise ConfigError(f"{where}.schedule: unknown schedule {name!r}; valid schedules: {names}{_suggest(name, names)}")
    factory = _schedule_factory(name)
    kwargs = {k: v for k, v in value.items() if k != "schedule"}
    _bind(f"{where}", f"optax.{factory.__name__}", factory, kwargs)
    return value


def _schedule_factory(name: str) -> Callable:
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
        raise ConfigError(f"{where}.name: unknown optimizer {name!r}; valid optimizers: {names}{_suggest(name, names)}")
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
    defaults = _noise_defaults(value["name"])
    for key in value:
        if key != "name" and key not in defaults:
            raise ConfigError(f"unknown key '{where}.{key}'; valid keys of {value['name']} noise: "
                              f"{['name', *defaults]}{_suggest(key, defaults)}")
    resolved = {"name": value["name"]}
    for key, default in defaults.items():
        kind = "bool" if isinstance(default, bool) else "int"
        resolved[key] = _check_value(f"{where}.{key}", Field(kind, default, f"a {kind}"), value.get(key, default))
    _build_noise(where, resolved)  # the noise source's own checks, named by key
    return resolved


def _build_noise(where: str, resolved: dict):
    kwargs = {key: value for key, value in resolved.items() if key != "name"}
    try:
        return _noise_class(resolved["name"])(**kwargs)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{where}: {error}") from None


def _bind(where: str, what: str, factory: Callable, kwargs: dict) -> None:
    signature = inspect.signature(factory)
    arguments = [p.name for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    try:
        signature.bind(**kwargs)
    except TypeError as error:
        raise ConfigError(f"{where}: {what} {error}; its arguments are {arguments}.") from None


# --------------------------------------------------------------------------- --set


def apply_overrides(config: dict, overrides: list[str]) -> dict:
    """``config`` with each ``"section.key[.sub...]=VALUE"`` applied (VALUE parsed as YAML).

    ``"section={...}"`` replaces a whole section, e.g. to switch strategy:
    ``--set 'strategy={name: SNES, popsize: 64}'``.
    """
    config = copy.deepcopy(config)
    for override in overrides:
        if "=" not in override:
            raise ConfigError(f"--set {override!r} must look like section.key=value, e.g. --set strategy.popsize=512.")
        dotted, text = override.split("=", 1)
        config = set_values(config, {dotted.strip(): parse_yaml(text, f"the value of --set {dotted}")})
    return config


def _check_strategy_switch(section: dict, name, flag: str) -> None:
    """Setting only ``strategy.name`` keeps the other keys, the old strategy's (its defaults too, once
    resolved): raise, showing the whole-section form, where the new strategy has no such keys."""
    old = section.get("name", DEFAULT_STRATEGY)
    if name == old or name not in _strategy_names():
        return  # the same strategy, or an unknown name (section_fields names the choices)
    stale = [key for key in section if key != "name" and key not in strategy_schema(name)]
    if stale:
        kept = ", ".join(f"{key}: {section[key]}" for key in ("popsize", "sigma") if key in section)
        raise ConfigError(
            f"{flag} strategy.name={name}: the strategy section still holds {old}'s keys {stale}, which {name} "
            f"does not take; switch strategy by replacing the whole section, e.g. {flag} "
            f"'strategy={{name: {name}{', ' + kept if kept else ''}}}'."
        )


def set_values(config: dict, values: dict[str, Any], flag: str = "--set") -> dict:
    """A copy of ``config`` with ``values`` (``"section.key[.sub...]" -> value``) set; ``flag`` names the source in errors.

    A dotted name of one section with a mapping value replaces the whole section.
    """
    config = copy.deepcopy(config)
    for dotted, value in values.items():
        path = dotted.split(".")
        if len(path) == 1 and path[0] in SCHEMA and isinstance(value, dict):
            config[path[0]] = value  # a whole section, e.g. --set 'strategy={name: SNES, popsize: 64}'
            continue
        if len(path) < 2 or not all(path):
            raise ConfigError(f"{flag} {dotted}: name a key as section.key (sections: {list(SCHEMA)}), "
                              "e.g. --set strategy.popsize=512.")
        section = path[0]
        _check_known(section, path[1], context=f"{flag} {dotted}: ", values=config.get(section) or {})
        if path == ["strategy", "name"]:
            _check_strategy_switch(config.get("strategy") or {}, value, flag)
        node = config.setdefault(section, {})
        for depth, part in enumerate(path[1:-1], start=1):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                parent = ".".join(path[: depth + 1])
                raise ConfigError(f"{flag} {dotted}: {parent} is {child!r}, not a mapping; set the whole value, "
                                  f"e.g. --set '{parent}={{...}}'.")
            node = child
        node[path[-1]] = value
    return config


# --------------------------------------------------------------------------- build


class Experiment(NamedTuple):
    """What a resolved config builds (no JAX computation yet)."""

    task: Any
    strategy: Any  # an es.Strategy


def _schedule(where: str, value: dict) -> Callable:
    """The optax schedule ``value`` describes; equal descriptions give the same object (see ``build``)."""
    return _schedule_from_json(where, json.dumps(value, sort_keys=True))


@functools.lru_cache(maxsize=256)
def _schedule_from_json(where: str, text: str) -> Callable:
    value = json.loads(text)
    factory = _schedule_factory(value["schedule"])
    kwargs = {k: v for k, v in value.items() if k != "schedule"}
    try:
        return factory(**kwargs)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{where}: optax.{factory.__name__}({_kwargs_text(kwargs)}) failed: {error}") from None


def _kwargs_text(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def _check_schedule_values(where: str, schedule: Callable, generations: int, positive: bool) -> None:
    """Raise unless ``schedule`` is finite (and > 0 when ``positive``) on generations [0, generations)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    steps = jnp.arange(max(generations, 1))
    try:
        values = np.asarray(jax.vmap(schedule)(steps), np.float64)
    except Exception as error:  # a schedule that cannot be evaluated is reported as such
        raise ConfigError(f"{where}: the schedule cannot be evaluated: {error}") from None
    bad = ~np.isfinite(values) | ((values <= 0) if positive else False)
    if bad.any():
        first = int(np.argmax(bad))
        need = "finite and > 0" if positive else "finite"
        raise ConfigError(f"{where}: the schedule is {values[first]:g} at generation {first}; it must be {need} "
                          f"for all run.generations={generations} (e.g. give cosine_decay an alpha > 0).")


def build(config: dict, inject_hyperparams: bool = False) -> Experiment:
    """The task and the strategy of a resolved config; raises ``ConfigError``.

    Equal schedule and optimizer descriptions give the same objects, so that
    the strategies of a sweep's runs share them (``es.evolve_many`` compares
    schedules by identity). ``inject_hyperparams`` builds the optimizer with
    ``optax.inject_hyperparams``: its numeric arguments then live in the
    optimizer state, where the runs of a sweep may differ in them.
    """
    import es

    task, strategy_config = make_task(config["task"]), config["strategy"]
    generations = config["run"]["generations"]
    name = strategy_config["name"]
    try:  # before anything is built that has the population's size
        es.validation.check_popsize(f"es.{name}", strategy_config["popsize"])
    except (TypeError, ValueError) as error:
        raise ConfigError(f"strategy.popsize: {error}") from None
    kwargs = {}
    for key, field in strategy_schema(name).items():
        where, value = f"strategy.{key}", strategy_config[key]
        if key == "name":
            continue
        if field.kind == "schedule" and isinstance(value, dict):
            value = _schedule(where, value)
            _check_schedule_values(where, value, generations, positive=True)
        elif field.kind == "optimizer":
            value = _build_optimizer(where, value, generations, inject_hyperparams)
        elif field.kind == "noise":
            value = _build_noise(where, value)
        kwargs[key] = value
    try:
        strategy = es.STRATEGIES[name](**kwargs)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"strategy: {error}") from None
    _check_run(config["run"])
    return Experiment(task, strategy)


def make_task(task: dict):
    """``tasks.make(name, **options)`` of a resolved ``task`` section; raises ``ConfigError``."""
    import tasks

    try:
        return tasks.make(task["name"], **task["options"])
    except (TypeError, ValueError) as error:
        raise ConfigError(f"task.options: {error}") from None


def _build_optimizer(where: str, value: dict, generations: int, inject_hyperparams: bool):
    return _optimizer_from_json(where, json.dumps(value, sort_keys=True), generations, inject_hyperparams)


@functools.lru_cache(maxsize=256)
def _optimizer_from_json(where: str, text: str, generations: int, inject_hyperparams: bool):
    import optax

    from es.strategies import optimizers

    value = json.loads(text)
    kwargs = {}
    for key, arg in value.items():
        if key == "name":
            continue
        if isinstance(arg, dict):
            arg = _schedule(f"{where}.{key}", arg)
            _check_schedule_values(f"{where}.{key}", arg, generations, positive=False)
        kwargs[key] = arg
    try:
        if inject_hyperparams:
            return optax.inject_hyperparams(optimizers.factory(value["name"]))(**kwargs)
        return optimizers.make(value["name"], **kwargs)  # shared: equal to the strategy's own default
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{where}: {value['name']}(...) failed: {error}") from None


def _check_run(run: dict) -> None:
    for key in ("generations", "seed", "island_generations"):
        if run[key] < 0:
            raise ConfigError(f"run.{key} must be >= 0, got {run[key]}.")
    for key in ("segment", "keep_checkpoints"):
        if run[key] < 1:
            raise ConfigError(f"run.{key} must be >= 1, got {run[key]}.")
    if run["islands"] < 1:
        raise ConfigError(f"run.islands must be >= 1 (1: one run per seed), got {run['islands']}.")
    if run["islands"] > 1 and not 0 < run["island_generations"] < run["generations"]:
        raise ConfigError(
            f"run.island_generations must be in [1, run.generations) with run.islands = {run['islands']}, got "
            f"{run['island_generations']} (run.generations is {run['generations']}); e.g. "
            f"--set run.island_generations={max(1, run['generations'] // 4)}."
        )
    if run["sigma_after_islands"] is not None and (run["islands"] == 1 or not run["sigma_after_islands"] > 0):
        raise ConfigError(
            f"run.sigma_after_islands must be > 0 and needs run.islands > 1, got {run['sigma_after_islands']} with "
            f"run.islands = {run['islands']}; e.g. --set run.islands=6 --set run.island_generations=500, or "
            "--set run.sigma_after_islands=null."
        )
    if run["num_devices"] is not None and run["num_devices"] < 1:
        raise ConfigError(f"run.num_devices must be >= 1 or null (all devices), got {run['num_devices']}.")


def check_update_traces(strategy, state) -> None:
    """Trace (without compiling) one update of ``strategy`` from ``state``, so bad optimizer arguments fail here.

    Shapes only: the update's inputs are ``jax.ShapeDtypeStruct``s under ``jax.eval_shape``, so the check
    allocates nothing in proportion to the population or the params.
    """
    import es

    try:
        es.engine.trace_update(strategy, state)
    except Exception as error:  # optax raises many types for bad hyperparameters
        raise ConfigError(f"strategy: one update step fails with these settings: {error}") from None


def initial_state(task, strategy, seed: int, fitness=None):
    """``(fitness, state)`` of a new run, seeded as ``es.init_from_seed`` seeds every run.

    ``fitness`` is what the run evolves with (default ``task.fitness``; e.g. an env task's
    ``fitness``).
    """
    import es

    fitness = task.fitness if fitness is None else fitness
    state = es.init_from_seed(strategy, seed, task.init_params, fitness=fitness)
    check_update_traces(strategy, state)
    return fitness, state


def identity(config: dict) -> dict:
    """What of a resolved config ``es.run`` cannot see itself and a resume must not change.

    The task, the strategy section and the seed; ``es.run`` adds the strategy's
    own description and the execution's identity (batch sizes, and the
    device count under ``exchange: gradient``), and refuses a resume where
    any of them differs. Every other ``run`` key may change on resume.
    """
    return {"task": config["task"], "strategy": config["strategy"], "seed": config["run"]["seed"]}


def from_identity(identity: dict, run: dict | None = None) -> dict:
    """The raw config whose ``identity`` is ``identity`` (task, strategy section, seed), with ``run`` keys added;
    every other ``run`` key is left to its default."""
    return {"task": identity["task"], "strategy": identity["strategy"], "run": {"seed": identity["seed"], **(run or {})}}
