"""Experiment configs: YAML loading, ``--set`` overrides and resolution, the one import for configs.

    task: {name: CartPole-v1, options: {num_episodes: 4}}
    strategy: {name: OpenES, popsize: 256, sigma: 0.05, optimizer: {name: adam, learning_rate: 0.01},
               antithetic: true, fitness_shaping: centered_rank, weight_decay: 0.0, maximize: true}
    run: {generations: 200, seed: 0, num_devices: null, segment: 50, keep_checkpoints: 3, exchange: fitness}

Only ``task.name`` is required; ``resolve`` fills in every default so the resolved config written to a run
directory says everything. A strategy section without ``popsize`` starts from the task's tuned defaults
(``tasks.default_settings``; ``task_strategy``). The ``strategy`` section is derived from the strategy's own
dataclass (``strategy.name`` is a key of ``es.STRATEGIES``, default OpenES): its keys are the constructor's
arguments, their defaults the dataclass defaults, their types the annotations. The ``run`` section's execution
keys are ``es.run``'s arguments, with its defaults. A float that the strategy accepts as a schedule (OpenES's
``sigma``) and any optimizer argument (``learning_rate``) may also be an optax schedule, ``{schedule:
cosine_decay, init_value: 1.0, decay_steps: 1000, alpha: 0.02}``. ``strategy.noise`` is ``prng`` (fresh
N(0, I) draws) or ``{name: table, size: 33554432, seed: 0}`` (a shared noise table).

Every mistake raises ``ConfigError`` (a ``ValueError``) naming the key and the valid choices, before anything
is compiled. Beside this module: ``config_schema`` (what a config may hold), ``config_values`` (one value
checked against its key) and ``config_build`` (the task, strategy and first state a resolved config builds),
whose public names this module also exports.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml

from experiments.config_build import Experiment, build, check_update_traces, initial_state, make_task
from experiments.config_schema import (
    DEFAULT_STRATEGY, REQUIRED, SCHEMA, ConfigError, section_fields, strategy_names, strategy_schema, suggest,
)
from experiments.config_values import check_value

__all__ = [  # the one import for configs: reading them here, what they may hold and what they build beside
    "ConfigError", "Experiment", "SCHEMA", "apply_overrides", "build", "check_update_traces", "dump", "from_identity",
    "identity", "initial_state", "load", "make_task", "parse_yaml", "resolve", "set_values", "strategy_schema",
    "task_strategy", "with_overrides",
]

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


def _check_known(section: str, key: str | None = None, context: str = "", values: dict | None = None) -> None:
    """Raise unless ``section`` (and ``section.key``) exist, naming the valid choices."""
    if section not in SCHEMA:
        raise ConfigError(
            f"{context}unknown config section {section!r}; valid sections: {list(SCHEMA)}{suggest(section, SCHEMA)}"
        )
    fields = section_fields(section, values)
    if key is not None and key not in fields:
        of = f"{section} ({values.get('name', DEFAULT_STRATEGY)})" if section == "strategy" else section
        raise ConfigError(
            f"{context}unknown key '{section}.{key}'; valid keys of {of}: {list(fields)}{suggest(key, fields)}"
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
            config[section][key] = check_value(where, field, value)
    return config


def task_strategy(task: dict, name: str | None = None) -> dict:
    """The strategy section a config without ``strategy.popsize`` starts from: ``tasks.default_settings`` of the
    resolved ``task`` section's task (its recommended strategy, or strategy ``name``'s defaults for it)."""
    import tasks

    if name is not None and name not in strategy_names():
        return {"name": name}  # section_fields names the choices
    return tasks.default_settings(make_task(task), name)


def with_overrides(raw: dict, overrides: list[str]) -> dict:
    """The resolved config of ``raw`` with ``--set`` ``overrides`` applied. The task's overrides first, so that a
    strategy section without ``popsize`` takes the defaults of the task they name; then all of them on that
    resolved config (so ``strategy.optimizer.learning_rate=...`` sets a key of the resolved default)."""
    task_first = [override for override in overrides if override.split("=", 1)[0].strip().split(".")[0] == "task"]
    return resolve(apply_overrides(resolve(apply_overrides(raw, task_first)), overrides))


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
    if name == old or name not in strategy_names():
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


# --------------------------------------------------------------------------- identity


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
