"""What a resolved experiment config builds: the task, the strategy (its schedules and optimizer), a run's
first state. Nothing here compiles; ``check_update_traces`` traces one update on shapes alone."""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, NamedTuple

from experiments.config_schema import ConfigError, strategy_schema
from experiments.config_values import build_noise, schedule_factory


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
    factory = schedule_factory(value["schedule"])
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
            value = build_noise(where, value)
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
