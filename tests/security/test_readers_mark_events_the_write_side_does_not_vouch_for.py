"""What a Kafka producer forges is shown as unverified, and counted and exported by no
reader unless asked.

With produce access to the event topic only, the attacker writes, one attack per test:

- a whole run the write side never recorded (a copy of a real one under a new id, its
  LLM calls claiming 2.5e9 tokens): it was listed as "succeeded, replayable full",
  ``stats`` summed its tokens and ``export --bodies --format openai-chat`` wrote its
  conversation into a fine-tuning dataset;
- an LLM call past the head of a running run (correctly chained);
- a ``tool.call`` of ``approve_refund`` and an LLM call after ``run.finished`` of a real,
  signed run (correctly chained): it was indexed and shown as ``tool=approve_refund``;
- an event inside a running run, ahead of the relay, whose chain hash does not follow
  (the attacker cannot read the topic): it took the real event's place.

Each time the console (run list and run page) shows an ``unverified`` tag whose title
says why, ``blackbox stats`` leaves the forged calls out of its totals (and counts them
with ``--include-unverified``), and ``blackbox export`` (and ``timeline``) leave the
forged events out (and write them with ``--include-unverified``).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import replace
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from agent_blackbox.cli import main
from agent_blackbox.console import LoopbackOnly, create_app
from agent_blackbox.consumers import ViewRunIndex
from agent_blackbox.outbox import Recorder, RunSnapshot
from agent_blackbox.schemas import Envelope, EventType, Settings
from tests.conftest import Login
from tests.integration._agents import RecordedRun, record_ticket_runs, ticket_ids
from tests.integration._views import build_analytics, build_views
from tests.security._signing import (
    produce,
    rechain,
    relay_all,
    sign_until,
    signing_key,
    topic_events,
    violations,
)

pytestmark = pytest.mark.integration

FORGED_TOKENS = 2_500_000_000


def _inflated(event: Envelope) -> Envelope:
    """``event`` (an LLM call) claiming :data:`FORGED_TOKENS` tokens."""
    tokens = {
        "prompt_tokens": str(FORGED_TOKENS - 1000),
        "completion_tokens": "1000",
        "total_tokens": str(FORGED_TOKENS),
    }
    return replace(event, attributes={**event.attributes, **tokens})


def _next(previous: Envelope, template: Envelope, **changes: Any) -> Envelope:
    """``template`` as the event after ``previous`` in its run, correctly chained: what
    a producer who reads the topic can write."""
    forged = replace(
        template,
        run_id=previous.run_id,
        tenant_id=previous.tenant_id,
        event_id=str(uuid.uuid4()),
        sequence=previous.sequence + 1,
        chain_hash="",
        **changes,
    )
    return replace(forged, chain_hash=forged.expected_chain_hash(previous.chain_hash))


def _first(events: Sequence[Envelope], kind: str) -> Envelope:
    return next(e for e in events if e.event_type == kind)


def _recorded(settings: Settings, engine: Engine) -> tuple[RecordedRun, list[Envelope]]:
    """One real, finished run of the ticket agent, relayed: its events in the topic."""
    [real] = record_ticket_runs(Recorder(engine, settings=settings), ticket_ids(1))
    relay_all(settings, engine)
    return real, topic_events(settings, real.run_id, expect=real.events)


def _project(settings: Settings, engine: Engine, *, expect: int) -> None:
    """Build the views and the analytics from everything in the topic."""
    build_views(settings, engine, expect=expect)
    build_analytics(settings, engine, group=f"analytics-{uuid.uuid4().hex[:8]}", expect=expect)


def _marks(engine: Engine, run_id: str) -> dict[int, str]:
    """Sequence → reason of the events of ``run_id`` the views mark unverified."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT sequence, unverified FROM blackbox_views.events "
                "WHERE run_id = :r AND unverified IS NOT NULL"
            ),
            {"r": run_id},
        )
        return {int(s): str(why) for s, why in rows}


# The readers ----------------------------------------------------------------------------


def _console(settings: Settings, reader: Engine) -> TestClient:
    app = create_app(settings, reader, LoopbackOnly())
    return TestClient(app, client=("127.0.0.1", 1), base_url="http://127.0.0.1:8765")


def _listed_row(html: str, run_id: str) -> str:
    """The run list's row of ``run_id``."""
    rows = [row for row in html.split("<tr") if f'href="/runs/{run_id}"' in row]
    assert len(rows) == 1, f"run {run_id} is listed {len(rows)} times"
    return rows[0]


def _tags(html: str) -> list[str]:
    """The titles of the ``unverified`` tags in ``html``."""
    found = re.findall(r'<span class="tag bad unverified" title="([^"]*)">unverified</span>', html)
    return [unescape(title) for title in found]


def _assert_console_marks(
    settings: Settings, reader: Engine, run_id: str, forged: Sequence[int], why: str
) -> None:
    client = _console(settings, reader)
    listed = client.get("/runs")
    assert listed.status_code == 200
    [title] = _tags(_listed_row(listed.text, run_id))
    assert "does not vouch for" in title
    assert why in title
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200
    assert 'id="unverified"' in page.text
    events = page.text.split('<table id="events">')[1]
    rows = {
        int(m.group(1)): m.group(2)
        for m in re.finditer(r'/events/(\d+)">\d+</a></td>(.*?)</tr>', events, re.S)
    }
    assert len(rows) >= len(forged)
    marked = sorted(seq for seq, row in rows.items() if _tags(row))
    assert marked == sorted(forged)


def _cli(settings: Settings, *args: str) -> Result:
    env = {
        "BLACKBOX_DATABASE_URL": settings.database_url,
        "BLACKBOX_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "BLACKBOX_TOPIC": settings.topic,
        "BLACKBOX_PURPOSE": None,
        "BLACKBOX_KEK": None,
        "BLACKBOX_KEK_FILE": None,
    }
    return CliRunner(env=env).invoke(main, list(args))


def _tokens(settings: Settings, *extra: str) -> dict[str, int]:
    """Run id → total tokens ``blackbox stats --by run`` shows."""
    shown = _cli(settings, "stats", "--by", "run", "--since", "1h", "--json", *extra)
    assert shown.exit_code == 0, shown.output
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    return {line["run"]: int(line["total_tokens"]) for line in lines}


def _exported(settings: Settings, run_id: str, *extra: str) -> list[int]:
    """The sequences ``blackbox export RUN_ID`` writes."""
    result = _cli(settings, "export", run_id, *extra)
    assert result.exit_code == 0, result.output
    return [int(json.loads(line)["sequence"]) for line in result.stdout.splitlines()]


def _timeline(settings: Settings, run_id: str, *extra: str) -> str:
    result = _cli(settings, "timeline", run_id, *extra)
    assert result.exit_code == 0, result.output
    return result.stdout


def _assert_left_out(
    settings: Settings, run_id: str, *, forged: Sequence[int], events: int
) -> None:
    """Export and timeline leave ``forged`` out unless asked; with ``--include-unverified``
    the run's ``events`` are all there."""
    everything = list(range(1, events + 1))
    assert _exported(settings, run_id) == [s for s in everything if s not in forged]
    assert _exported(settings, run_id, "--include-unverified") == everything
    shown = _timeline(settings, run_id, "--include-unverified")
    assert shown.count("(unverified)") == len(forged)
    assert "(unverified)" not in _timeline(settings, run_id)


# The attacks ----------------------------------------------------------------------------


def test_a_run_the_write_side_never_recorded_is_unverified_uncounted_and_unexported(
    settings: Settings, engine: Engine, login: Login
) -> None:
    real, events = _recorded(settings, engine)
    forged_id = f"forged-{uuid.uuid4().hex[:8]}"
    copied = [_inflated(e) if e.event_type == EventType.LLM_CALL else e for e in events]
    forged = rechain(copied, run_id=forged_id)
    produce(settings, forged)
    _project(settings, engine, expect=real.events * 2)

    reader = login("blackbox_reader", tenant=events[0].tenant_id)
    _assert_console_marks(
        settings, reader, forged_id, range(1, len(forged) + 1), "holds no run of this id"
    )
    page = _console(settings, reader).get(f"/runs/{forged_id}").text
    assert re.search(r'id="replayability">unverified<', page)

    counted = _tokens(settings)
    assert forged_id not in counted
    assert real.run_id in counted
    assert sum(counted.values()) < FORGED_TOKENS
    assert _tokens(settings, "--include-unverified")[forged_id] >= FORGED_TOKENS

    assert _exported(settings, forged_id) == []
    chat = ("--bodies", "--purpose", "building a dataset", "--format", "openai-chat")
    dataset = _cli(settings, "export", "--since", "1h", *chat)
    assert dataset.exit_code == 0, dataset.output
    assert forged_id not in dataset.stdout
    assert real.run_id in dataset.stdout
    assert "the write side does not vouch for" in dataset.stderr
    everything = _cli(settings, "export", "--since", "1h", *chat, "--include-unverified")
    assert everything.exit_code == 0, everything.output
    assert forged_id in everything.stdout
    assert set(_marks(engine, forged_id)) == set(range(1, len(forged) + 1))
    assert _marks(engine, real.run_id) == {}


def test_an_event_past_a_running_run_s_head_is_unverified(
    settings: Settings, engine: Engine, login: Login
) -> None:
    real, events = _recorded(settings, engine)  # gives an LLM call to copy
    run = Recorder(engine, settings=settings).start_run(
        RunSnapshot(code_version="head.1", input={}), agent_id="ticket-agent"
    )
    run.now()
    run.now()
    relay_all(settings, engine)
    own = topic_events(settings, run.run_id, expect=run.last_sequence)
    forged = _next(own[-1], _inflated(_first(events, EventType.LLM_CALL)))
    produce(settings, [forged])
    _project(settings, engine, expect=real.events + len(own) + 1)

    past = forged.sequence
    reader = login("blackbox_reader", tenant=forged.tenant_id)
    _assert_console_marks(settings, reader, run.run_id, [past], "past the write side's head")
    assert run.run_id not in _tokens(settings)
    assert _tokens(settings, "--include-unverified")[run.run_id] >= FORGED_TOKENS
    _assert_left_out(settings, run.run_id, forged=[past], events=past)
    assert _marks(engine, run.run_id) == {
        past: f"sequence {past} is past the write side's head ({past - 1})"
    }


def test_events_after_a_signed_run_s_end_are_unverified(
    settings: Settings, engine: Engine, login: Login, tmp_path: Path
) -> None:
    key = signing_key(tmp_path)
    real, events = _recorded(settings, engine)
    build_views(settings, engine, expect=real.events)
    index = ViewRunIndex(engine)
    sign_until(
        settings, engine, key.signer, lambda: index.checkpoint(real.run_id), what="signed end"
    )
    end = events[-1]
    assert end.event_type == EventType.RUN_FINISHED
    refund = _next(end, _first(events, EventType.TOOL_CALL), attributes={"tool": "approve_refund"})
    call = _next(refund, _inflated(_first(events, EventType.LLM_CALL)))
    produce(settings, [refund, call])
    _project(settings, engine, expect=real.events + 2)

    with engine.connect() as conn:
        status, count, last, tools = conn.execute(
            text(
                "SELECT r.status, r.event_count, r.last_sequence, u.tools "
                "FROM blackbox_views.runs r JOIN blackbox_views.run_rollups u USING (run_id) "
                "WHERE r.run_id = :r"
            ),
            {"r": real.run_id},
        ).one()
    assert (status, count, last) == ("succeeded", real.events, real.events)
    assert "approve_refund" not in tools
    reader = login("blackbox_reader", tenant=end.tenant_id)
    _assert_console_marks(
        settings, reader, real.run_id, [refund.sequence, call.sequence], "follows the run's"
    )
    assert _tokens(settings)[real.run_id] < FORGED_TOKENS
    assert _tokens(settings, "--include-unverified")[real.run_id] >= FORGED_TOKENS
    _assert_left_out(
        settings, real.run_id, forged=[refund.sequence, call.sequence], events=call.sequence
    )
    after = f"it follows the run's run.finished (sequence {end.sequence})"
    assert _marks(engine, real.run_id) == {refund.sequence: after, call.sequence: after}


def test_an_event_off_the_chain_ahead_of_the_relay_is_unverified(
    settings: Settings, engine: Engine, login: Login
) -> None:
    real, events = _recorded(settings, engine)
    run = Recorder(engine, settings=settings).start_run(
        RunSnapshot(code_version="chain.1", input={}), agent_id="ticket-agent"
    )
    run.now()
    relay_all(settings, engine)
    own = topic_events(settings, run.run_id, expect=run.last_sequence)
    run.now()  # committed, not relayed yet: the write side's head moves on
    run.now()
    # A producer who cannot read the topic does not know the chain hash to write.
    forged = replace(
        _next(own[-1], _inflated(_first(events, EventType.LLM_CALL))), chain_hash="ab" * 32
    )
    produce(settings, [forged])
    _project(settings, engine, expect=real.events + len(own) + 1)

    broken = forged.sequence
    reader = login("blackbox_reader", tenant=forged.tenant_id)
    _assert_console_marks(settings, reader, run.run_id, [broken], "does not follow")
    assert run.run_id not in _tokens(settings)
    assert _tokens(settings, "--include-unverified")[run.run_id] >= FORGED_TOKENS
    _assert_left_out(settings, run.run_id, forged=[broken], events=broken)
    off_chain = {broken: f"its chain hash does not follow from sequence {broken - 1}'s"}
    assert _marks(engine, run.run_id) == off_chain

    # The relay then publishes the real events: the one the forgery displaced is a
    # violation, and the next one, chained to the real event, is vouched for.
    relay_all(settings, engine)
    build_views(settings, engine, expect=real.events + len(own) + 2)
    assert violations(engine, run.run_id) == [("digest_mismatch", broken)]
    assert _marks(engine, run.run_id) == off_chain
