"""Experiment configs: the schema, YAML loading, ``--set`` overrides, validation, and the objects they build.

    task: {name: CartPole-v1, options: {num_episodes: 4}}
    strategy: {popsize: 256, sigma: 0.05, optimizer: {name: adam, learning_rate: 0.01}, antithetic: true,
               fitness_shaping: centered_rank, weight_decay: 0.0, maximize: true}
    run: {generations: 200, seed: 0, num_devices: null, segment: 50, keep_checkpoints: 3}

Only ``task.name`` is required; ``resolve`` fills in every default (``SCHEMA``)
so the resolved config written to a run directory says everything. ``sigma``
and any optimizer argument (``learning_rate``) may also be an optax schedule,
``{schedule: cosine_decay, init_value: 1.0, decay_steps: 1000, alpha: 0.02}``.
``strategy.noise`` is ``prng`` (fresh N(0, I) draws) or
``{name: table, size: 33554432, seed: 0}`` (a shared noise table).

Every mistake raises ``ConfigError`` (a ``ValueError``) naming the key and the
valid choices, before anything is compiled.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import numbers
import re
from typing import Any, Callable, NamedTuple

import yaml

REQUIRED = object()


class ConfigError(ValueError):
    """A config key or value that cannot be used."""


class Field(NamedTuple):
    kind: str  # int, float, bool, str, optional_int, choice, mapping, schedule, optimizer, noise
    default: Any
    help: str
    choices: Callable[[], list[str]] | None = None


def _shaping_methods() -> list[str]:
    from es import shaping

    return sorted(shaping.SHAPING_METHODS)


def _exchange_modes() -> list[str]:
    from es.strategy import EXCHANGE_MODES

    return list(EXCHANGE_MODES)


def _task_names() -> list[str]:
    import tasks

    return tasks.names()


SCHEMA: dict[str, dict[str, Field]] = {
    "task": {
        "name": Field("choice", REQUIRED, "the task, one of tasks.names()", _task_names),
        "options": Field("mapping", {}, "keyword options of tasks.make(name, **options)"),
    },
    "strategy": {
        "popsize": Field("int", 256, "members per generation"),
        "sigma": Field("schedule", 0.05, "perturbation scale > 0, or a schedule"),
        "optimizer": Field("optimizer", {"name": "adam", "learning_rate": 0.01}, "an optax optimizer and its arguments"),
        "antithetic": Field("bool", True, "evaluate +/- pairs"),
        "fitness_shaping": Field("choice", "centered_rank", "fitness -> weights", _shaping_methods),
        "weight_decay": Field("float", 0.0, "L2 coefficient >= 0"),
        "maximize": Field("bool", True, "maximise the task's fitness"),
        "noise": Field("noise", {"name": "prng"}, "prng, or {name: table, size, seed}"),
        "exchange": Field("choice", "fitness", "what crosses devices", _exchange_modes),
        "eval_batch_size": Field("optional_int", None, "members evaluated together (null: automatic)"),
        "update_batch_size": Field("optional_int", None, "noise vectors rebuilt together (null: automatic)"),
    },
    "run": {
        "generations": Field("int", 200, "total generations"),
        "seed": Field("int", 0, "seed of the initial params and of the run key"),
        "num_devices": Field("optional_int", None, "devices to shard the population over (null: all that divide popsize)"),
        "segment": Field("int", 50, "generations per compiled call; log, progress and checkpoint after each"),
        "keep_checkpoints": Field("int", 3, "how many of the latest checkpoints to keep"),
    },
}

NOISE_DEFAULTS = {"prng": {}, "table": {"size": 2**25, "seed": 0}}

# optax optimizers whose update needs more than (updates, state, params) cannot drive ES.
_UNSUPPORTED_OPTIMIZERS = {"lbfgs", "polyak_sgd"}


def optimizer_names() -> list[str]:
    """The optax optimizer factories a config may name (``optax.adam``, ``optax.sgd``, ...)."""
    import optax

    return sorted(
        name for name in dir(optax)
        if inspect.isfunction(getattr(optax, name)) and getattr(optax, name).__module__ == "optax._src.alias"
        and name not in _UNSUPPORTED_OPTIMIZERS
    )


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
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_known(section: str, key: str | None = None, context: str = "") -> None:
    """Raise unless ``section`` (and ``section.key``) exist in ``SCHEMA``, naming the valid choices."""
    if section not in SCHEMA:
        raise ConfigError(
            f"{context}unknown config section {section!r}; valid sections: {list(SCHEMA)}{_suggest(section, SCHEMA)}"
        )
    fields = SCHEMA[section]
    if key is not None and key not in fields:
        raise ConfigError(
            f"{context}unknown key '{section}.{key}'; valid keys of {section}: {list(fields)}{_suggest(key, fields)}"
        )


def resolve(raw: dict) -> dict:
    """The full config: ``raw`` checked against ``SCHEMA``, defaults filled in."""
    if not isinstance(raw, dict):
        raise ConfigError(f"the config must be a mapping with the sections {list(SCHEMA)}.")
    for section in raw:
        _check_known(section)
    config = {}
    for section, fields in SCHEMA.items():
        given = raw.get(section, {})
        if given is None:
            given = {}
        if not isinstance(given, dict):
            raise ConfigError(f"config section {section!r} must be a mapping of {list(fields)}, got {given!r}.")
        for key in given:
            _check_known(section, key)
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
    if kind == "float":
        return _check_float(where, value, field.help)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false ({field.help}), got {value!r}.")
        return value
    if kind == "choice":
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
    for key, arg in kwargs.items():
        if isinstance(arg, dict):
            _check_schedule(f"{where}.{key}", arg)
    import optax

    _bind(where, f"optax.{name}", getattr(optax, name), kwargs)
    return value


def _check_noise(where: str, value: Any) -> dict:
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict) or value.get("name") not in NOISE_DEFAULTS:
        raise ConfigError(f"{where} must be one of {list(NOISE_DEFAULTS)} or {{name: table, size: INT, seed: INT}}, "
                          f"got {value!r}.")
    defaults = NOISE_DEFAULTS[value["name"]]
    for key in value:
        if key != "name" and key not in defaults:
            raise ConfigError(f"unknown key '{where}.{key}'; valid keys of {value['name']} noise: "
                              f"{['name', *defaults]}{_suggest(key, defaults)}")
    resolved = {"name": value["name"]}
    for key, default in defaults.items():
        resolved[key] = _check_value(f"{where}.{key}", Field("int", default, "an int"), value.get(key, default))
    if value["name"] == "table":
        from es.noise import _MAX_TABLE_SIZE

        if not 1 <= resolved["size"] <= _MAX_TABLE_SIZE:
            raise ConfigError(f"{where}.size must be in [1, 2**31 - 1] (float32 values in the table; at least 10x "
                              f"the number of parameters is best, e.g. {NOISE_DEFAULTS['table']['size']}), "
                              f"got {resolved['size']}.")
    return resolved


def _bind(where: str, what: str, factory: Callable, kwargs: dict) -> None:
    signature = inspect.signature(factory)
    arguments = [p.name for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    try:
        signature.bind(**kwargs)
    except TypeError as error:
        raise ConfigError(f"{where}: {what} {error}; its arguments are {arguments}.") from None


# --------------------------------------------------------------------------- --set


def apply_overrides(config: dict, overrides: list[str]) -> dict:
    """``config`` with each ``"section.key[.sub...]=VALUE"`` applied (VALUE parsed as YAML)."""
    config = copy.deepcopy(config)
    for override in overrides:
        if "=" not in override:
            raise ConfigError(f"--set {override!r} must look like section.key=value, e.g. --set strategy.popsize=512.")
        dotted, text = override.split("=", 1)
        path = dotted.strip().split(".")
        value = parse_yaml(text, f"the value of --set {dotted}")
        if len(path) < 2 or not all(path):
            raise ConfigError(f"--set {dotted}: name a key as section.key (sections: {list(SCHEMA)}), "
                              "e.g. --set strategy.popsize=512.")
        section = path[0]
        _check_known(section, path[1], context=f"--set {dotted}: ")
        node = config.setdefault(section, {})
        for depth, part in enumerate(path[1:-1], start=1):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                parent = ".".join(path[: depth + 1])
                raise ConfigError(f"--set {dotted}: {parent} is {child!r}, not a mapping; set the whole value, "
                                  f"e.g. --set '{parent}={{...}}'.")
            node = child
        node[path[-1]] = value
    return config


# --------------------------------------------------------------------------- build


class Experiment(NamedTuple):
    """What a resolved config builds (no JAX computation yet)."""

    task: Any
    strategy: Any  # es.OpenES


def _schedule(where: str, value: dict) -> Callable:
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


def build(config: dict) -> Experiment:
    """The task and the ``es.OpenES`` of a resolved config; raises ``ConfigError``."""
    import optax

    import es
    import tasks

    task_config, strategy_config = config["task"], config["strategy"]
    generations = config["run"]["generations"]
    try:
        task = tasks.make(task_config["name"], **task_config["options"])
    except (TypeError, ValueError) as error:
        raise ConfigError(f"task.options: {error}") from None

    sigma = strategy_config["sigma"]
    if isinstance(sigma, dict):
        sigma = _schedule("strategy.sigma", sigma)
        _check_schedule_values("strategy.sigma", sigma, generations, positive=True)
    optimizer_config = strategy_config["optimizer"]
    kwargs = {}
    for key, arg in optimizer_config.items():
        if key == "name":
            continue
        if isinstance(arg, dict):
            arg = _schedule(f"strategy.optimizer.{key}", arg)
            _check_schedule_values(f"strategy.optimizer.{key}", arg, generations, positive=False)
        kwargs[key] = arg
    try:
        optimizer = getattr(optax, optimizer_config["name"])(**kwargs)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"strategy.optimizer: optax.{optimizer_config['name']}(...) failed: {error}") from None
    noise_config = strategy_config["noise"]
    options = {k: v for k, v in strategy_config.items() if k not in ("sigma", "optimizer", "noise")}
    try:
        noise = es.NoiseTable(noise_config["size"], noise_config["seed"]) if noise_config["name"] == "table" \
            else es.GaussianNoise()
        strategy = es.OpenES(sigma=sigma, optimizer=optimizer, noise=noise, **options)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"strategy: {error}") from None
    _check_run(config["run"])
    return Experiment(task, strategy)


def _check_run(run: dict) -> None:
    for key in ("generations", "seed"):
        if run[key] < 0:
            raise ConfigError(f"run.{key} must be >= 0, got {run[key]}.")
    for key in ("segment", "keep_checkpoints"):
        if run[key] < 1:
            raise ConfigError(f"run.{key} must be >= 1, got {run[key]}.")
    if run["num_devices"] is not None and run["num_devices"] < 1:
        raise ConfigError(f"run.num_devices must be >= 1 or null (all devices), got {run['num_devices']}.")


def check_optimizer_traces(strategy, params) -> None:
    """Trace (without compiling) one optimizer step on ``params`` so bad optimizer arguments fail here."""
    import jax

    try:
        jax.eval_shape(lambda p: strategy.optimizer.update(p, strategy.optimizer.init(p), p), params)
    except Exception as error:  # optax raises many types for bad hyperparameters
        raise ConfigError(f"strategy.optimizer: one update step fails with these arguments: {error}") from None


def initial_state(task, strategy, seed: int, fitness=None):
    """``(fitness, state)`` of a new run: params from ``task.init_params`` and the run key, both from ``seed``.

    ``init_key, run_key = split(key(seed))``. ``fitness`` is what the run evolves with
    (default ``task.fitness``; e.g. an env task's ``counting_fitness``).
    """
    import jax

    init_key, run_key = jax.random.split(jax.random.key(seed))
    params = task.init_params(init_key)
    check_optimizer_traces(strategy, params)
    fitness = task.fitness if fitness is None else fitness
    return fitness, strategy.init(run_key, params, fitness=fitness)


def identity(config: dict) -> dict:
    """The part of a resolved config that determines a run's results.

    A run may be resumed with another ``run.generations`` (to extend it),
    ``run.segment`` or ``run.keep_checkpoints``, and, unless the strategy
    exchanges gradients (whose rounding depends on the device count), with
    another ``run.num_devices``.
    """
    run = {"seed": config["run"]["seed"]}
    if config["strategy"]["exchange"] == "gradient":
        run["num_devices"] = config["run"]["num_devices"]
    return {"task": config["task"], "strategy": config["strategy"], "run": run}
