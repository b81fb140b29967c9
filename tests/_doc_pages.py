"""Running a documentation page in a test: the environment it gets and the model servers
its SDK clients reach (see tests/_doc_blocks.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tests._doc_blocks import BIN, ROOT, Page, PageRun
from tests.integration.frameworks._model import AgentAnthropicServer, AgentOpenAIServer


@contextmanager
def model_servers() -> Iterator[dict[str, str]]:
    """Local OpenAI- and Anthropic-compatible servers standing in for the providers: the
    SDKs the pages build without arguments read these variables."""
    with AgentOpenAIServer() as openai, AgentAnthropicServer() as anthropic:
        yield {
            "OPENAI_BASE_URL": openai.base_url,
            "OPENAI_API_KEY": "sk-docs-test-0000",
            "ANTHROPIC_BASE_URL": anthropic.base_url.removesuffix("/v1"),
            "ANTHROPIC_API_KEY": "sk-ant-docs-test-0000",
            "OPENAI_AGENTS_DISABLE_TRACING": "1",
        }


def run_page(
    page: Page, folder: Path, env: Mapping[str, str], *, database_url: str | None = None
) -> None:
    """Run ``page`` in ``folder``.

    Raises:
        DocBlockError: a block failed.
    """
    full = {
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)]),
        **env,
    }
    PageRun(page, folder, full, database_url).run()
