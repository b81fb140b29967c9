"""The after-heal check every fault scenario ends with, and the figures it yields.

Once the faults are over and the processes healed, it asks:

1. committed = published, after deduplication: every committed event id is on the topic
   (the topic is read the way the project's readers read it: an :class:`EpochFence` drops
   a stale relay's copies, then copies are deduplicated by (run, sequence));
2. per-run order: each run's first copies, in offset order, have sequences 1, 2, 3, ...;
3. the views are exact: the events index holds exactly the committed events, each run
   row counts them, no integrity violation was recorded;
4. the effects table matches the effect events: one row per ``effect.intent``, one
   settled status per ``effect.receipt``;
5. the outbox is empty;
6. ``blackbox verify --all`` is clean (exit 0).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from sqlalchemy import func, select, text

from agent_blackbox.broker import EpochFence
from agent_blackbox.consumers import events_index, integrity_violations, runs_view
from agent_blackbox.outbox.storage import effects, runs
from agent_blackbox.schemas import EnvelopeCodec
from tests.faults._harness import ROOT, Scenario, eventually


@dataclass
class Figures:
    """What one scenario did and what the check found; the soak prints these."""

    scenario: str
    events: int = 0
    """Events committed (each event id counted once)."""
    messages: int = 0
    """Messages on the topic, poison included."""
    lost: int = 0
    """Committed events with no copy on the topic."""
    phantom: int = 0
    """Admitted first copies whose event id never committed."""
    reordered: int = 0
    """First copies out of sequence order within their run."""
    duplicates_published: int = 0
    """Copies beyond the first of a (run, sequence)."""
    stale_published: int = 0
    """Copies published after a newer event of the same run (what a paused relay's
    queue does without the purge); the fence should drop each of them."""
    fenced: int = 0
    """Copies the epoch fence dropped."""
    stale_applied: int = 0
    """View rows that are not the committed event of their (run, sequence), plus
    integrity violations the views recorded."""
    undecodable: int = 0
    """Messages that are not envelopes (the poison scenario injects them)."""
    committed_twice: int = 0
    """Event ids committed more than once (a retried append after an ambiguous commit)."""
    views_exact: bool = False
    effects_match: bool = False
    outbox_left: int = 0
    verify_exit: int = -1
    verify_output: str = ""
    verify_problems: int = 0
    """Runs ``verify --all`` found a problem with."""
    verify_skipped: int = 0
    """Messages ``verify --all`` skipped as not events (a finding: it exits 1)."""
    takeovers_s: list[float] = field(default_factory=list)
    """Per fault: seconds until the pipeline recovered (the scenario says from what)."""
    acknowledged_lost: int = 0
    """Events an agent was told were recorded that the database no longer holds (a
    failover to a standby that had not received them)."""
    broken: list[str] = field(default_factory=list)
    """What a scenario's own checks found broken beyond the after-heal check (the
    backup's, say), in words."""
    writer_failures: int = 0
    duration_s: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)

    def problems(self) -> list[str]:
        """Every guarantee the check found broken, in words (empty when all held)."""
        if "error" in self.notes:
            return [f"the scenario did not complete: {self.notes['error']}"]
        found = [
            f"{name} = {value}"
            for name in (
                "lost",
                "acknowledged_lost",
                "phantom",
                "reordered",
                "stale_applied",
                "committed_twice",
            )
            if (value := getattr(self, name))
        ]
        found.extend(self.broken)
        if self.outbox_left:
            found.append(f"{self.outbox_left} rows left in the outbox")
        if not self.views_exact:
            found.append("the views do not match what committed")
        if not self.effects_match:
            found.append("the effects table does not match the effect events")
        # verify --all exits 1 for a message that is not an event; only the poison this
        # scenario injected may be such a finding, and it must be found whole.
        poison = int(self.notes.get("poison", 0))
        expected_exit = 1 if poison else 0
        if (
            self.verify_exit != expected_exit
            or self.verify_problems
            or self.verify_skipped != poison
        ):
            found.append(
                f"verify --all exited {self.verify_exit} with {self.verify_problems} runs in "
                f"trouble and {self.verify_skipped} messages skipped ({poison} poison "
                f"injected): {self.verify_output}"
            )
        return found

    def json_line(self) -> str:
        line = asdict(self)
        line.pop("verify_output")
        line["duration_s"] = round(self.duration_s, 1)
        line["takeovers_s"] = [round(t, 2) for t in self.takeovers_s]
        return json.dumps(line)


@dataclass(frozen=True)
class _Copy:
    run_id: str
    sequence: int
    event_id: str
    event_type: str


def after_heal(current: Scenario, figures: Figures, *, timeout: float = 180.0) -> Figures:
    """Run the whole check once the faults are over; fills and returns ``figures``."""
    phases: dict[str, float] = {}
    began = time.monotonic()

    def phase(name: str) -> None:
        nonlocal began
        now = time.monotonic()
        phases[name] = round(now - began, 2)
        began = now

    waited(current, lambda: current.outbox_rows() == 0, timeout=timeout, what="outbox drained")
    figures.outbox_left = current.outbox_rows()
    phase("drain")
    committed = _committed(current, figures)
    firsts = _read_topic(current, figures)
    _compare(committed, firsts, figures)
    phase("topic")
    _views(current, committed, figures, timeout=timeout)
    _effects(current, firsts, figures)
    phase("views")
    _verify(current, figures, timeout=timeout)
    phase("verify")
    figures.notes["check_s"] = phases
    return figures


def waited(current: Scenario, probe: Callable[[], bool], *, timeout: float, what: str) -> None:
    """``eventually``, with the scenario's state and logs in the failure."""
    try:
        eventually(probe, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{current.diagnosis()}") from None


def stale_so_far(current: Scenario) -> int:
    """Copies published after newer events of their run, on the topic so far."""
    figures = Figures(scenario=current.name)
    _read_topic(current, figures)
    return figures.stale_published


def _committed(current: Scenario, figures: Figures) -> dict[tuple[str, int], str]:
    """(run, sequence) → event id of everything that committed (the trigger's copy)."""
    with current.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT run_id, sequence, event_id::text FROM public.fault_committed")
        ).all()
    ids = Counter(str(r[2]) for r in rows)
    figures.committed_twice = sum(n - 1 for n in ids.values() if n > 1)
    figures.events = len(ids)
    return {(str(r[0]), int(r[1])): str(r[2]) for r in rows}


def _read_topic(current: Scenario, figures: Figures) -> dict[tuple[str, int], _Copy]:
    """The first admitted copy of each (run, sequence), in offset order per partition."""
    settings = current.settings
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"fault-check-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    codec, fence = EnvelopeCodec(), EpochFence()
    firsts: dict[tuple[str, int], _Copy] = {}
    last_first: dict[str, int] = {}  # run → sequence of its last admitted first copy
    raw: dict[str, list[int]] = defaultdict(list)  # run → every copy's sequence, in order
    try:
        topic = consumer.list_topics(settings.topic, timeout=10).topics[settings.topic]
        left: dict[int, int] = {}  # partition → its end offset, while not reached
        for partition in topic.partitions:
            tp = TopicPartition(settings.topic, partition)
            _, high = consumer.get_watermark_offsets(tp, timeout=10)
            if high > 0:
                left[partition] = high
        consumer.assign([TopicPartition(settings.topic, p, 0) for p in left])
        deadline = time.monotonic() + 120
        while left:
            assert time.monotonic() < deadline, f"{settings.topic} not read in time: {left}"
            for msg in consumer.consume(5000, 0.5):
                error = msg.error()
                assert error is None, f"reading {settings.topic}: {error}"
                partition = msg.partition() or 0
                if (msg.offset() or 0) + 1 >= left.get(partition, 0):
                    left.pop(partition, None)
                figures.messages += 1
                try:
                    envelope = codec.decode(msg.value() or b"")
                except Exception:
                    figures.undecodable += 1
                    continue
                run, seq = envelope.run_id, envelope.sequence
                raw[run].append(seq)
                headers = msg.headers()
                if not fence.admit(partition, headers if isinstance(headers, list) else None):
                    continue
                if (run, seq) in firsts:
                    figures.duplicates_published += 1
                    continue
                if seq != last_first.get(run, 0) + 1:
                    figures.reordered += 1
                last_first[run] = seq
                firsts[(run, seq)] = _Copy(run, seq, envelope.event_id, envelope.event_type)
    finally:
        consumer.close()
    figures.stale_published = sum(_stale_copies(copies) for copies in raw.values())
    figures.fenced = fence.dropped
    return firsts


def _compare(
    committed: dict[tuple[str, int], str], firsts: dict[tuple[str, int], _Copy], figures: Figures
) -> None:
    published = {key: copy.event_id for key, copy in firsts.items()}
    figures.lost = sum(1 for key, eid in committed.items() if published.get(key) != eid)
    figures.phantom = sum(1 for key, eid in published.items() if committed.get(key) != eid)


def _views(
    current: Scenario,
    committed: dict[tuple[str, int], str],
    figures: Figures,
    *,
    timeout: float,
) -> None:
    """Wait until the consumers indexed as many events as committed, then compare."""
    waited(
        current,
        lambda: current.indexed() >= len(committed),
        timeout=timeout,
        what="views caught up",
    )
    with current.engine.connect() as conn:
        index = conn.execute(
            select(events_index.c.run_id, events_index.c.sequence, events_index.c.event_id)
        ).all()
        run_rows = conn.execute(
            select(runs_view.c.run_id, runs_view.c.event_count, runs_view.c.last_sequence)
        ).all()
        heads = conn.execute(select(runs.c.run_id, runs.c.last_sequence)).all()
        violations = conn.execute(
            select(func.count()).select_from(integrity_violations)
        ).scalar_one()
    viewed = {(str(r[0]), int(r[1])): str(r[2]) for r in index}
    wrong = sum(1 for key, eid in viewed.items() if committed.get(key) != eid)
    figures.stale_applied = wrong + int(violations)
    expected_runs = {str(r[0]): (int(r[1]), int(r[1])) for r in heads}
    counted_runs = {str(r[0]): (int(r[1]), int(r[2])) for r in run_rows}
    figures.views_exact = (
        viewed == committed and len(index) == len(committed) and counted_runs == expected_runs
    )
    if not figures.views_exact:
        missing = len(committed.keys() - viewed.keys())
        runs_off = sum(1 for r, c in expected_runs.items() if counted_runs.get(r) != c)
        figures.notes["views"] = {"missing": missing, "runs_off": runs_off, "rows": len(index)}


def _effects(current: Scenario, firsts: dict[tuple[str, int], _Copy], figures: Figures) -> None:
    """One effects row per effect.intent (at its sequence); as many settled rows as
    effect.receipt events."""
    intents = {(c.run_id, c.sequence) for c in firsts.values() if c.event_type == "effect.intent"}
    receipts = Counter(c.run_id for c in firsts.values() if c.event_type == "effect.receipt")
    with current.engine.connect() as conn:
        rows = conn.execute(
            select(effects.c.run_id, effects.c.intent_sequence, effects.c.status)
        ).all()
    rows_at = {(str(r[0]), int(r[1])) for r in rows}
    settled: Counter[str] = Counter(str(r[0]) for r in rows if r[2] != "pending")
    figures.effects_match = rows_at == intents and len(rows) == len(intents) and settled == receipts
    if not figures.effects_match:
        figures.notes["effects"] = {
            "rows": len(rows),
            "intents": len(intents),
            "settled": sum(settled.values()),
            "receipts": sum(receipts.values()),
        }


def _verify(current: Scenario, figures: Figures, *, timeout: float) -> None:
    command = [sys.executable, "-m", "agent_blackbox.cli", "verify", "--all", "--json"]
    done = subprocess.run(
        command, env=current.env(), cwd=ROOT, capture_output=True, timeout=timeout, check=False
    )
    figures.verify_exit = done.returncode
    try:
        reports = json.loads(done.stdout)
    except ValueError:
        reports = []
    figures.verify_problems = sum(1 for r in reports if r.get("problem"))
    figures.verify_skipped = sum(len(r.get("skipped_messages") or ()) for r in reports)
    if done.returncode != 0:
        figures.verify_output = _verify_summary(done.stdout, done.stderr)


def _verify_summary(stdout: bytes, stderr: bytes) -> str:
    """What went wrong, short: the runs with a problem, or the last error lines."""
    try:
        reports = json.loads(stdout)
        bad = [r for r in reports if r.get("problem")]
        return json.dumps(bad[:3])[:800]
    except ValueError:
        return stderr.decode(errors="replace")[-800:]


def takeover(current: Scenario, owner: str, *, since: float, timeout: float = 60.0) -> float:
    """Seconds from ``since`` (a monotonic time) until ``owner`` holds every shard."""
    shards = current.settings.outbox_shards
    eventually(
        lambda: current.shards_held(owner) == shards, timeout=timeout, what=f"{owner} took over"
    )
    return time.monotonic() - since


def _stale_copies(sequences: list[int]) -> int:
    """Copies in one run's offset-ordered ``sequences`` that a stale publisher sent after
    newer events of the run.

    A crashed relay's successor republishes the rows the crashed one had not deleted:
    a block of repeated sequences that ends at the newest sequence the run had on the
    topic (a relay reads its next batch only after deleting the last). A block of
    repeats that ends *below* that newest sequence came from a publisher that kept
    sending after the run moved on: those copies are stale.
    """
    seen: set[int] = set()
    newest, stale, block = 0, 0, 0
    previous: int | None = None
    for seq in [*sequences, None]:
        repeat = seq is not None and seq in seen
        if block and not (repeat and seq == (previous or 0) + 1):
            if previous is not None and previous < newest:
                stale += block
            block = 0
        if seq is None:
            break
        if repeat:
            block += 1
        else:
            seen.add(seq)
            newest = max(newest, seq)
        previous = seq
    return stale
