"""Installing the library brings only what it needs: `import es` loads none of the extras' packages."""

import subprocess
import sys

import pytest

EXTRAS = ("yaml", "matplotlib", "gymnax", "tasks", "experiments", "evosax", "flax", "tqdm", "cma", "cocoex",
          "cocopp")


def test_importing_es_loads_no_package_of_an_extra():
    code = f"import sys, es; print(sorted(m for m in {EXTRAS!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_importing_es_leaves_orbax_until_a_checkpoint_needs_it():
    """orbax-checkpoint (about 0.15 s to import) is a core dependency, but only runs with checkpoints use it."""
    code = "import sys, es; print('orbax.checkpoint' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", out


@pytest.mark.parametrize("collecting", [True, False])
def test_importing_es_leaves_the_garbage_collector_as_it_was_and_its_imports_frozen(collecting):
    """es.startup: no cyclic collection during the import, the imported objects frozen after it."""
    code = (f"import gc; {'' if collecting else 'gc.disable(); '}import es, jax; "
            "print(gc.isenabled(), gc.get_freeze_count() > 50_000, "
            "gc.is_tracked(jax.jit) and jax.jit in gc.get_objects())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(collecting), "True", "False"], out  # jax.jit: tracked, but in no generation a collection reads


# The layers of docs/design.md: a module may import from its own floor and those below, never above.
FLOORS = {
    "es.validation": 0, "es.compat": 0, "es.compilation_cache": 0, "es.executable_cache": 0,
    "es.startup": 0,
    "es.noise": 1,
    "es.engine.members": 2, "es.engine.batching": 2, "es.engine.partition": 2, "es.engine.stopping": 2,
    "es.engine.compiler": 2,
    "es.fitness": 3,
    "es.strategies": 4,
    "es.parallel": 5,
    "es.engine": 6,
    "es.host": 7,
    "es.runs": 8, "es.blackbox": 8, "es.parallel.collectives": 8, "es.launch": 8, "es": 9,
}


def floor(module: str) -> int:
    """The floor of ``module``: that of the longest prefix in ``FLOORS``."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in FLOORS:
            return FLOORS[".".join(parts[:end])]
    raise KeyError(module)


def imported(path, module: str) -> list[str]:
    """Every es module that ``module`` (at ``path``) imports, at any depth of its code."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "es":
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found += [n if n.replace(".", "/") and _is_module(n) else node.module for n in names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "es"]
    return found


def _is_module(name: str) -> bool:
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_module_imports_only_from_its_floor_and_below():
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    upward = []
    for path in sorted((root / "es").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for target in imported(path, module):
            if floor(target) > floor(module):
                upward.append(f"{module} (floor {floor(module)}) imports {target} (floor {floor(target)})")
    assert not upward, "\n".join(upward)


ONE_IDEA: dict[str, str] = {}  # a module over 450 lines, and the one idea it holds (none: the last two were split)


def test_no_module_is_long_unless_it_is_one_idea():
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    long = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in (root / "es").rglob("*.py")}
    assert {name for name, lines in long.items() if lines > 450} <= set(ONE_IDEA)
