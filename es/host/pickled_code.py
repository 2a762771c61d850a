"""Source file names for functions that ``cloudpickle`` sends by value.

cloudpickle (3.1.3 and later) writes every code object it pickles by value
(functions of ``__main__``, of a notebook, of a test module the worker cannot
import) with the file name ``"<dynamic-code>"``, so that payloads do not depend
on where a function was defined. A traceback raised in a worker then names no
file and shows no source lines. ``es.HostFitness`` keeps them:

    files = source_files(fn)               # this process: {(qualname, first line): file}
    payload = cloudpickle.dumps((fn, files))
    ...
    fn, files = cloudpickle.loads(payload)  # the worker
    restore_source_files(fn, files)         # tracebacks name the files and quote the lines again

Both walk the same functions: ``fn`` and, recursively, the functions of its
module that it holds in its closure or names as globals (``functools.partial``
and bound methods unwrapped; for a class, or a callable object, the methods
of its class). Workers run on the same machine, so ``linecache`` reads the files.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable, Iterator

DYNAMIC_FILENAME = "<dynamic-code>"


def _functions_reached(fn: Any) -> Iterator[types.FunctionType]:
    """The functions behind ``fn`` and those of their module reachable through closures and globals.

    Functions of other modules (libraries) are pickled by reference, not by
    value, and are not walked: the walk stays within the modules ``fn`` comes from.
    """
    roots = list(_unwrapped(fn))
    home = {root.__module__ for root in roots}
    pending, seen = roots, set()
    while pending:
        function = pending.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        yield function
        held = [cell.cell_contents for cell in function.__closure__ or () if _filled(cell)]
        held += [function.__globals__[name] for name in _names_used(function.__code__) if name in function.__globals__]
        pending += [f for obj in held for f in _unwrapped(obj) if f.__module__ in home]


def _unwrapped(obj: Any) -> Iterator[types.FunctionType]:
    """The Python functions ``obj`` is or wraps: ``functools.partial`` arguments, bound methods, and the
    methods of a class or of a callable object's class (``__call__`` and the methods it may call)."""
    if isinstance(obj, functools.partial):
        for part in (obj.func, *obj.args, *obj.keywords.values()):
            yield from _unwrapped(part)
    elif isinstance(obj, (types.MethodType, staticmethod, classmethod)):
        yield from _unwrapped(obj.__func__)
    elif isinstance(obj, types.FunctionType):
        yield obj
    elif isinstance(obj, type):
        for member in vars(obj).values():
            if isinstance(member, (types.FunctionType, staticmethod, classmethod)):
                yield from _unwrapped(member)
    elif callable(obj):
        yield from _unwrapped(type(obj))


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell (a variable not yet assigned)
        return False
    return True


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and the code objects nested in it (inner functions, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _names_used(code: types.CodeType) -> set[str]:
    return {name for nested in _codes(code) for name in nested.co_names}


def source_files(fn: Callable) -> dict[tuple[str, int], str]:
    """``{(co_qualname, co_firstlineno): co_filename}`` for every code object ``fn`` reaches.

    Best effort, like ``restore_source_files``: file names only make
    tracebacks readable, so an object the walk does not expect gives ``{}``
    rather than an error.
    """
    try:
        return {(code.co_qualname, code.co_firstlineno): code.co_filename
                for function in _functions_reached(fn) for code in _codes(function.__code__)}
    except Exception:  # noqa: BLE001 (cosmetic: never stop a run over a file name)
        return {}


def _restored(code: types.CodeType, files: dict[tuple[str, int], str]) -> types.CodeType:
    consts = tuple(_restored(c, files) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    filename = code.co_filename
    if filename == DYNAMIC_FILENAME:
        filename = files.get((code.co_qualname, code.co_firstlineno), filename)
    return code.replace(co_filename=filename, co_consts=consts)


def restore_source_files(fn: Callable, files: dict[tuple[str, int], str]) -> None:
    """Give the unpickled functions ``fn`` reaches their file names back (in place; best effort)."""
    try:
        for function in _functions_reached(fn):
            if any(code.co_filename == DYNAMIC_FILENAME for code in _codes(function.__code__)):
                function.__code__ = _restored(function.__code__, files)
    except Exception:  # noqa: BLE001 (cosmetic: a worker evaluates fn with or without its file names)
        pass
