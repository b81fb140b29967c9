"""The environment of its own that the instructor and LlamaIndex recipes run in
(``_compat_env``): built once, when the selected tests need it, before the first of them
starts (so that its install, a few minutes on a cold cache, counts against no test's
timeout), its progress written to the test log; reused as it is after that. And the
driver that runs a module's agent there, against the module's ``model`` server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration._llm_server import LLMServer
from tests.integration.frameworks._compat import Driver
from tests.integration.frameworks._compat_env import (
    CompatEnv,
    CompatEnvUnavailable,
    ensure_compat_env,
)

_PREPARED = pytest.StashKey[CompatEnv | CompatEnvUnavailable]()


def _prepared(config: pytest.Config) -> CompatEnv | CompatEnvUnavailable:
    if _PREPARED not in config.stash:
        reporter = config.pluginmanager.get_plugin("terminalreporter")

        def say(line: str) -> None:
            if reporter is not None:
                reporter.write_line(f"[framework venv] {line}")

        try:
            config.stash[_PREPARED] = ensure_compat_env(say=say)
        except CompatEnvUnavailable as exc:
            config.stash[_PREPARED] = exc
    return config.stash[_PREPARED]


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    if any("compat_env" in getattr(item, "fixturenames", ()) for item in session.items):
        _prepared(session.config)


@pytest.fixture(scope="session")
def compat_env(pytestconfig: pytest.Config) -> CompatEnv:
    """The environment with ``agent-blackbox[instructor,llama-index]`` installed: skips
    the test when the package index cannot be reached to build it, fails it when the
    build failed otherwise."""
    prepared = _prepared(pytestconfig)
    if isinstance(prepared, CompatEnvUnavailable):
        if prepared.offline:
            pytest.skip(str(prepared))
        pytest.fail(str(prepared), pytrace=False)
    return prepared


@pytest.fixture(scope="module")
def driver(
    compat_env: CompatEnv,
    model: LLMServer,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Driver]:
    """The module's agent driver (``_compat.Driver``) in the environment of its own,
    talking to the module's ``model`` server; its output is kept in a file of its own."""
    log = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]) / "driver.log"
    with Driver(compat_env, model.base_url, log) as running:
        yield running
