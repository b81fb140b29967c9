"""The documentation: every page's code blocks are of a kind the tests know, the ones
that need no service run, and the settings reference names every variable the code reads.
(The pages that need Postgres and Kafka run in tests/integration/test_docs_stack.py;
``make test`` builds the site with ``mkdocs build --strict``.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests._doc_blocks import ROOT, Page, documented_variables, pages, parse_check
from tests._doc_pages import model_servers, run_page

PAGES = pages()
UNIT_PAGES = [page for page in PAGES if not page.stack]
PACKAGE_FOLDERS = (
    "blackbox", "schemas", "keystore", "broker", "outbox", "consumers", "replayer",
    "backup", "console", "stack", "cli", "examples",
)  # fmt: skip
NO_SERVICES = {
    # Nothing on a unit-tier page may reach a real database or broker by accident.
    "BLACKBOX_DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:9/none",
    "BLACKBOX_KAFKA_BOOTSTRAP": "127.0.0.1:9",
}


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_block_passes_its_parse_check(page: Page) -> None:
    assert page.error is None
    for block in page.blocks:
        if block.kind in ("parse", "run"):
            parse_check(block)


@pytest.mark.parametrize("page", UNIT_PAGES, ids=[page.name for page in UNIT_PAGES])
@pytest.mark.timeout(600)
def test_page_runs(page: Page, tmp_path: Path) -> None:
    with model_servers() as providers:
        run_page(page, tmp_path, {**NO_SERVICES, **providers})


def test_the_pages_have_blocks_of_every_kind_they_claim() -> None:
    kinds = {(block.language, block.kind) for page in PAGES for block in page.blocks}
    assert ("python", "run") in kinds
    assert ("sh", "run") in kinds
    assert ("text", "output") in kinds


def test_the_settings_reference_names_every_variable_the_code_reads() -> None:
    read = set()
    for folder in PACKAGE_FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            read |= set(re.findall(r"BLACKBOX_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    assert read - documented_variables() == set()


def test_the_readme_is_one_screen_and_links_into_the_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 60
    assert "make demo" in readme
    assert "make test" in readme
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), link
