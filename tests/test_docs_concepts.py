"""Every code snippet of the concept pages (docs/concepts/) runs, so they cannot rot (docs_snippets.py)."""

import pytest
from docs_snippets import page_id, python_pages, run_page

pytestmark = pytest.mark.slow  # make test-fast leaves it out: runs every snippet of the concept pages


@pytest.mark.parametrize("page", python_pages("docs/concepts"), ids=page_id)
def test_python_snippets_run(page, monkeypatch):
    run_page(page, monkeypatch)
