"""Every code snippet in the README and the top-level docs pages runs, so the docs cannot rot; every fenced
block has a language; the shell snippets name real modules and make targets. (The guides' and the concepts'
snippets: test_docs_guides.py, test_docs_concepts.py; the machinery: docs_snippets.py.)"""

from __future__ import annotations

import importlib.util
import re

import pytest
from docs_snippets import FENCE, PAGES, ROOT, blocks, page_id, python_pages, run_page

pytestmark = pytest.mark.slow  # make test-fast leaves it out: runs every snippet of the top pages


@pytest.mark.parametrize("page", python_pages("top"), ids=page_id)
def test_python_snippets_run(page, monkeypatch):
    run_page(page, monkeypatch)


def test_every_page_with_python_blocks_is_run_by_one_test_file():
    areas = python_pages("top") + python_pages("docs/guides") + python_pages("docs/concepts")
    assert sorted(areas) == [p for p in PAGES if blocks(p, "python")]


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
