"""Name -> task factory, with errors that list the valid choices."""

from __future__ import annotations

import inspect
from typing import Any, Callable

_FACTORIES: dict[str, Callable[..., Any]] = {}


def register(name: str, factory: Callable[..., Any]) -> None:
    """Make ``tasks.make(name, **options)`` call ``factory(**options)``."""
    if name in _FACTORIES:
        raise ValueError(f"task {name!r} is already registered")
    _FACTORIES[name] = factory


def names() -> list[str]:
    """Every name ``tasks.make`` accepts, sorted."""
    return sorted(_FACTORIES)


def options(name: str) -> list[str]:
    """The keyword options of task ``name``."""
    return [p.name for p in inspect.signature(_lookup(name)).parameters.values() if p.kind == p.KEYWORD_ONLY
            or p.kind == p.POSITIONAL_OR_KEYWORD]


def _lookup(name: str) -> Callable[..., Any]:
    if not isinstance(name, str):
        raise TypeError(f"task name must be a str, got {type(name).__name__}; valid names: {names()}")
    if name not in _FACTORIES:
        raise ValueError(f"unknown task {name!r}; valid names: {names()}")
    return _FACTORIES[name]


def make(name: str, **kwargs: Any) -> Any:
    """The task called ``name``, configured by ``kwargs`` (see ``tasks.names()``)."""
    factory = _lookup(name)
    valid = options(name)
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for task {name!r}; valid options: {valid}")
    return factory(**kwargs)
