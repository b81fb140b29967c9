"""The documentation pages that need Postgres and Kafka (first line
``<!-- docs-test: stack -->``): each runs, block by block, against a database and a topic
of its own, as a reader would on the local stack or their own services."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_blackbox.schemas import Settings
from tests._doc_blocks import Page, pages
from tests._doc_pages import model_servers, run_page

pytestmark = pytest.mark.integration

STACK_PAGES = [page for page in pages() if page.stack]


@pytest.mark.parametrize("page", STACK_PAGES, ids=[page.name for page in STACK_PAGES])
@pytest.mark.timeout(900)
def test_page_runs_on_the_stack(page: Page, settings: Settings, tmp_path: Path) -> None:
    env = {
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_CONSUMER_GROUP": settings.consumer_group,
    }
    with model_servers() as providers:
        run_page(
            page,
            tmp_path,
            {**env, **providers},
            database_url=settings.database_url,
        )
