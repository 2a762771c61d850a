"""Every code snippet in the docs and the README runs, so the docs cannot rot.

- ```python blocks: executed in order, one namespace per page (later blocks build on earlier ones);
  they carry their own assertions.
- ```bash blocks: every `python -m MODULE` they mention must be importable, and every `make TARGET`
  must exist in the Makefile.
- ```text blocks are messages or output, not code.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys
import types

import cloudpickle
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(page: pathlib.Path, language: str) -> list[str]:
    return [code for lang, code in FENCE.findall(page.read_text()) if lang == language]


def page_id(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "python")], ids=page_id)
def test_python_snippets_run(page, monkeypatch):
    monkeypatch.chdir(ROOT)
    # A real module, so dataclasses (flax modules) defined in a snippet can find it in sys.modules; its
    # functions are still pickled by value (es.HostFitness ships them to workers that cannot import it).
    module = types.ModuleType(f"docs_{page.stem}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    cloudpickle.register_pickle_by_value(module)
    namespace = module.__dict__
    try:
        run_blocks(page, namespace)
    finally:
        cloudpickle.unregister_pickle_by_value(module)


def run_blocks(page: pathlib.Path, namespace: dict) -> None:
    for number, code in enumerate(blocks(page, "python"), start=1):
        try:
            exec(compile(code, f"{page_id(page)}[python block {number}]", "exec"), namespace)
        except Exception as error:  # name the page and block, keep the traceback
            raise AssertionError(f"{page_id(page)}: python block {number} failed: {error!r}") from error


def test_every_fenced_block_has_a_language():
    for page in PAGES:
        for language, code in FENCE.findall(page.read_text()):
            assert language, f"{page_id(page)}: a fenced block has no language:\n{code[:200]}"


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "bash")], ids=page_id)
def test_shell_snippets_name_real_modules_and_targets(page):
    makefile = (ROOT / "Makefile").read_text()
    for code in blocks(page, "bash"):
        for module in re.findall(r"python[\d.]* -m ([\w.]+)", code):
            assert importlib.util.find_spec(module) is not None, f"{page_id(page)}: no module {module}"
        for target in re.findall(r"^\s*make (\w[\w-]*)", code, re.MULTILINE):
            assert re.search(rf"^{re.escape(target)}:", makefile, re.MULTILINE), f"{page_id(page)}: no make {target}"
