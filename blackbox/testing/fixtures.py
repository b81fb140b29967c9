"""pytest fixtures for an agent's own test suite: a fresh in-memory recorder per test.

Enable them once, in the suite's top ``conftest.py``::

    pytest_plugins = ["agent_blackbox.testing.fixtures"]

then ask for one by name::

    from agent_blackbox import RunSnapshot
    from agent_blackbox.testing import replay

    def test_the_agent_replays(blackbox_recorder):
        run, _ = blackbox_recorder.record(agent, RunSnapshot("v1", {"q": "hi"}), agent_id="a")
        assert replay(blackbox_recorder, agent).passed

Nothing is shared between tests: each gets a recorder of its own, with an empty list of
events, and no database, broker or network is touched.
"""

from __future__ import annotations

import pytest

from agent_blackbox.testing import AsyncMemoryRecorder, MemoryRecorder

__all__ = ["blackbox_async_recorder", "blackbox_recorder"]


@pytest.fixture
def blackbox_recorder() -> MemoryRecorder:
    """A :class:`~agent_blackbox.testing.MemoryRecorder` of the test's own: record with it
    as with :class:`~agent_blackbox.Recorder`; ``.events`` holds what was recorded."""
    return MemoryRecorder()


@pytest.fixture
def blackbox_async_recorder() -> AsyncMemoryRecorder:
    """An :class:`~agent_blackbox.testing.AsyncMemoryRecorder` of the test's own, for
    asyncio agents (``await blackbox_async_recorder.record(...)``)."""
    return AsyncMemoryRecorder()
