"""Running a documentation page in a test: the environment it gets, the front door's
pending names, and the stand-in variant (see tests/_doc_blocks.py, tests/_front_door.py)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests import _front_door
from tests._doc_blocks import BIN, ROOT, DocBlockError, Page, PageRun
from tests.integration.frameworks._model import AgentAnthropicServer, AgentOpenAIServer

STAND_INS = ROOT / "tests" / "_front_door_site"


def uses_missing_names(page: Page) -> list[str]:
    """The pending front-door names the page's blocks use that do not exist yet."""
    code = "\n".join(block.code for block in page.blocks)
    used = []
    for name in _front_door.missing():
        short = name.rpartition(".")[2]
        imported = re.search(rf"from agent_blackbox import [^\n]*\b{short}\b", code)
        if re.search(rf"\b(bb|agent_blackbox)\.{short}\b", code) or imported:
            used.append(name)
    return used


def variants(pages: list[Page]) -> list[object]:
    """``(page, stand_ins)`` parameters: every page as written, and pages that use a
    missing front-door name once more with the stand-ins."""
    params: list[object] = []
    for page in pages:
        params.append(pytest.param(page, False, id=page.name))
        if uses_missing_names(page):
            params.append(pytest.param(page, True, id=f"{page.name}[stand-ins]"))
    return params


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
    page: Page,
    folder: Path,
    env: Mapping[str, str],
    *,
    stand_ins: bool,
    database_url: str | None = None,
) -> None:
    """Run ``page`` in ``folder``; a failure at a missing front-door name is an expected
    failure naming it, unless the stand-ins fill it in.

    Raises:
        DocBlockError: a block failed for any other reason.
    """
    paths = [str(folder), str(ROOT)]
    if stand_ins:
        paths.insert(0, str(STAND_INS))
        _front_door.install()
    full = {
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(paths),
        **env,
    }
    if stand_ins:
        PageRun(page, folder, full, database_url).run()
        return
    with pending_expected(page):
        PageRun(page, folder, full, database_url).run()


@contextmanager
def pending_expected(page: Page) -> Iterator[None]:
    """A failure at a front-door name that does not exist yet is an expected failure
    naming it; any other failure goes on."""
    try:
        yield
    except (DocBlockError, ImportError, AttributeError) as exc:
        name = _front_door.missing_name_in(f"{type(exc).__name__}: {exc}")
        if name is None:
            raise
        pytest.xfail(f"{page.name} uses {name}, which the front door does not provide yet")


@pytest.fixture
def stand_ins_undone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Whatever the stand-ins put in place is taken away after the test."""
    import sys

    import agent_blackbox

    before = dict(vars(agent_blackbox))
    had_testing = "agent_blackbox.testing" in sys.modules
    yield
    for name in set(vars(agent_blackbox)) - set(before):
        delattr(agent_blackbox, name)
    if not had_testing:
        sys.modules.pop("agent_blackbox.testing", None)
