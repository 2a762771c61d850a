"""Name -> task factory, with errors that list the valid choices.

Names come from two places: single factories (``register(name, factory)``)
and families whose names are looked up when needed
(``register_family(list_names, factory_for)``), such as every environment id
gymnax knows, including ids registered with ``gymnax.register`` after
``tasks`` was imported. Families are consulted lazily, so ``tasks.make("sphere")``
does not import gymnax.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from es import validation

_FACTORIES: dict[str, Callable[..., Any]] = {}
_FAMILIES: list[tuple[Callable[[], list[str]], Callable[[str], Callable[..., Any]]]] = []


def make_owner(name: str) -> str:
    """What ``es.validation``'s messages name for an option of ``tasks.make(name, ...)``: ``tasks.make('name')``,
    shown as ``tasks.make('name', option=value)``."""
    return f"tasks.make({name!r})"


def register(name: str, factory: Callable[..., Any]) -> None:
    """Make ``tasks.make(name, **options)`` call ``factory(**options)``."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"task name must be a non-empty str, got {name!r}")
    if not callable(factory):
        raise TypeError(f"factory for task {name!r} must be callable, got {type(factory).__name__}")
    if name in _FACTORIES:
        raise ValueError(f"task {name!r} is already registered")
    _FACTORIES[name] = factory


def register_family(list_names: Callable[[], list[str]], factory_for: Callable[[str], Callable[..., Any]]) -> None:
    """Make every name in ``list_names()`` (asked at lookup time) a task built by ``factory_for(name)``."""
    _FAMILIES.append((list_names, factory_for))


def names() -> list[str]:
    """Every name ``tasks.make`` accepts, sorted."""
    found = set(_FACTORIES)
    for list_names, _ in _FAMILIES:
        found.update(list_names())
    return sorted(found)


def is_name(name: str) -> bool:
    """Whether ``tasks.make`` accepts ``name``; a registered name is found without listing the families (which
    would import gymnax, about a second)."""
    return name in _FACTORIES or any(name in list_names() for list_names, _ in _FAMILIES)


def options(name: str) -> list[str]:
    """The keyword options of task ``name``."""
    return _options(_lookup(name))


def _options(factory: Callable[..., Any]) -> list[str]:
    return [p.name for p in inspect.signature(factory).parameters.values() if p.kind == p.KEYWORD_ONLY
            or p.kind == p.POSITIONAL_OR_KEYWORD]


def _lookup(name: str) -> Callable[..., Any]:
    if not isinstance(name, str):
        raise TypeError(f"task name must be a str, got {type(name).__name__}; valid names: {names()}")
    if name in _FACTORIES:
        return _FACTORIES[name]
    for list_names, factory_for in _FAMILIES:
        if name in list_names():
            return factory_for(name)
    valid = names()
    close = validation.closest(name, valid)
    hint = f"did you mean {close!r}? " if close else ""
    raise ValueError(f"unknown task {name!r}; {hint}valid names: {valid}")


def make(name: str, **kwargs: Any) -> Any:
    """The task called ``name``, configured by ``kwargs`` (see ``tasks.names()``)."""
    factory = _lookup(name)
    valid = _options(factory)
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        close = [match for option in unknown if (match := validation.closest(option, valid))]
        hint = f"did you mean {close}? " if close else ""
        raise ValueError(f"unknown option(s) {unknown} for task {name!r}; {hint}valid options: {valid}")
    return factory(**kwargs)
