"""Every code snippet of the guides (docs/guides/) runs, so they cannot rot (docs_snippets.py)."""

import pytest
from docs_snippets import page_id, python_pages, run_page

pytestmark = pytest.mark.slow  # make test-fast leaves it out: runs every snippet of the guides


@pytest.mark.parametrize("page", python_pages("docs/guides"), ids=page_id)
def test_python_snippets_run(page, monkeypatch):
    run_page(page, monkeypatch)
