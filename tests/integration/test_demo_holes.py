"""The demo's runs are complete: ``blackbox demo`` records the ticket agent on the real
recorder, in a pool of threads, with the recorder's network guard at its default
(``warn``), and no run reports a call that left the process through no boundary."""

from __future__ import annotations

import warnings

import pytest
from rich.console import Console
from sqlalchemy import Engine, text

from agent_blackbox.examples import demo
from agent_blackbox.outbox import UnrecordedCallWarning
from agent_blackbox.schemas import EnvelopeCodec, Settings

pytestmark = pytest.mark.integration


def test_the_demos_runs_record_no_hole(
    settings: Settings, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BLACKBOX_RECORD_NETWORK", raising=False)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        # The demo's own recording step: the ticket agent, 12 runs, 4 at a time.
        run_ids = demo._record(engine, settings, 12, 4, Console(quiet=True), {})
    assert not [w for w in warned if issubclass(w.category, UnrecordedCallWarning)]
    codec = EnvelopeCodec()
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT envelope FROM blackbox.outbox")).scalars()
        ends = [e for e in map(codec.decode, rows) if e.event_type == "run.finished"]
    assert sorted(e.run_id for e in ends) == sorted(run_ids)
    assert [e.attributes for e in ends if "unrecorded_calls" in e.attributes] == []
