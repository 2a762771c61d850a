"""Running the docs' code snippets, for the tests that run them (test_docs*.py: one process per area of the
docs, so that ``make test`` runs the areas side by side).

- ```python blocks: executed in order, one namespace per page (later blocks build on earlier ones);
  they carry their own assertions.
- ```bash blocks: every `python -m MODULE` they mention must be importable, and every `make TARGET`
  must exist in the Makefile.
- ```text blocks are messages or output, not code.
"""

from __future__ import annotations

import pathlib
import re
import sys
import types

import cloudpickle

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(page: pathlib.Path, language: str) -> list[str]:
    return [code for lang, code in FENCE.findall(page.read_text()) if lang == language]


def page_id(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


def python_pages(area: str) -> list[pathlib.Path]:
    """The pages with python blocks under ``area`` (``"docs/guides"``, ...), or README.md and docs/*.md for
    ``"top"``."""
    if area == "top":
        chosen = [p for p in PAGES if p.parent in (ROOT, ROOT / "docs")]
    else:
        chosen = [p for p in PAGES if p.is_relative_to(ROOT / area)]
    return [p for p in chosen if blocks(p, "python")]


def run_page(page: pathlib.Path, monkeypatch) -> None:
    """Every python block of ``page`` in order, in one namespace; a failure names the page and the block."""
    monkeypatch.chdir(ROOT)
    # A real module, so dataclasses (flax modules) defined in a snippet can find it in sys.modules; its
    # functions are still pickled by value (es.HostFitness ships them to workers that cannot import it).
    module = types.ModuleType(f"docs_{page.stem}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    cloudpickle.register_pickle_by_value(module)
    namespace = module.__dict__
    try:
        for number, code in enumerate(blocks(page, "python"), start=1):
            try:
                exec(compile(code, f"{page_id(page)}[python block {number}]", "exec"), namespace)
            except Exception as error:  # name the page and block, keep the traceback
                raise AssertionError(f"{page_id(page)}: python block {number} failed: {error!r}") from error
    finally:
        cloudpickle.unregister_pickle_by_value(module)
