"""What differs between a checkpoint and this run, in words: the configs' dotted keys, the arrays' paths, dtypes and
shapes (the messages of a refused resume)."""

from __future__ import annotations

from typing import Any


def signature_difference(stored: list[dict], expected: list[dict]) -> str:
    """Where a checkpoint's leaves (``stored``) differ from this run's (``expected``): at most three, in words."""

    def fmt(entry):
        return f"{entry['dtype']}{entry['shape']}"

    stored_by_path = {e["path"]: e for e in stored}
    expected_by_path = {e["path"]: e for e in expected}
    parts = []
    for path in stored_by_path.keys() - expected_by_path.keys():
        parts.append(f"the checkpoint has {path} ({fmt(stored_by_path[path])}) which this run lacks")
    for path in expected_by_path.keys() - stored_by_path.keys():
        parts.append(f"this run has {path} ({fmt(expected_by_path[path])}) which the checkpoint lacks")
    for path in stored_by_path.keys() & expected_by_path.keys():
        if stored_by_path[path] != expected_by_path[path]:
            parts.append(
                f"{path} is {fmt(stored_by_path[path])} in the checkpoint but {fmt(expected_by_path[path])} here"
            )
    if not parts:
        parts.append("the same leaves in another order")
    parts.sort()
    more = f" (and {len(parts) - 3} more)" if len(parts) > 3 else ""
    return "; ".join(parts[:3]) + more


def describe_difference(old: Any, new: Any, old_name: str = "checkpoint", new_name: str = "this run") -> str:
    """Every dotted key where the JSON-like configs ``old`` and ``new`` differ."""
    differences = []

    def walk(a, b, path):
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b), key=str):
                where = f"{path}.{key}" if path else str(key)
                if key not in a:
                    differences.append(f"{where} is only in {new_name} ({b[key]!r})")
                elif key not in b:
                    differences.append(f"{where} is only in {old_name} ({a[key]!r})")
                else:
                    walk(a[key], b[key], where)
        elif a != b:
            differences.append(f"{path or 'config'}: {old_name} has {a!r}, {new_name} has {b!r}")

    walk(old, new, "")
    return "; ".join(differences) or "no difference"
