"""Runs whose ids break today's run id rule, for tests of the readers that show them.

Runs recorded before the rule existed, archives written then, and messages forged on the
topic may carry any run id; every reader must still show such an id escaped and quoted.
The recorder refuses them now, so a test that needs one records with the check lifted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from agent_blackbox.outbox import _core


@contextmanager
def unchecked_run_ids() -> Iterator[None]:
    """Inside the block, a recorder takes any run id, as it did before the rule."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_core, "check_run_id", lambda value: value)
        yield
