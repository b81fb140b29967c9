"""Replay digests a crossing's input as the code gave it when the recorded event says no
redaction rule fired on it (``Contract.expected``), and scrubs it only when that misses
the recorded digest. Every ask must come out as the whole way gives it, and a divergence
must be reported from scrubbed values."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

import agent_blackbox as bb
from agent_blackbox.outbox import AgentRun, MemoryRecorder, Redactor, RunSnapshot
from agent_blackbox.outbox._request_memo import Expected
from agent_blackbox.outbox._scrub import Scrub
from agent_blackbox.outbox.contract import Ask, Contract
from agent_blackbox.replayer import replay_run
from agent_blackbox.replayer._log import RecordedLog
from agent_blackbox.schemas import RFC8785, EventType, plain_ordered_text

SECRETS = ("erin.stone@example.com", "sk-proj-" + "Q9w8E7r6T5y4U3i2" * 3, "password=hunter2hunter2")
WORDS = ("refund", "order", "late", "parcel", "box", "the", "a", "second")


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 8)))
        return text + (" " + rng.choice(SECRETS) if rng.random() < 0.15 else "")
    if kind == 1:
        return rng.choice([1, 1.0, -0.0, 2**60, 0.25, True, None])
    if kind == 2:
        return json.dumps({"note": rng.choice(WORDS), "n": rng.randint(0, 9)})
    if kind in (3, 4):
        return rng.choice(WORDS)
    if kind == 5:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == 6:
        return tuple(_value(rng, depth + 1) for _ in range(rng.randint(0, 3)))
    keys = rng.sample(["b", "a", "token", "api_key", "card", "number", "cvc", "é", "z"], 3)
    return {key: _value(rng, depth + 1) for key in keys}


def _asks(contract: Contract, rng: random.Random) -> list[tuple[str, Any]]:
    """One ask of each kind the contract takes as given, from the same draws."""
    args = tuple(_value(rng) for _ in range(rng.randint(0, 2)))
    kwargs = {f"k{i}": _value(rng) for i in range(rng.randint(0, 2))}
    arguments = {"to": _value(rng), "body": _value(rng)}
    state, reason = _value(rng), rng.choice([None, "because " + rng.choice(SECRETS), "ok"])
    tool = contract.tool("lookup", args, kwargs)
    intent = contract.intent("send_mail", "k-1", arguments)
    transition = contract.transition("open", "closed", state, reason)
    return [("tool", tool), ("intent", intent), ("transition", transition)]


def _same(mine: Ask, theirs: Ask) -> None:
    assert mine.event_type == theirs.event_type
    assert mine.input_digest == theirs.input_digest
    assert plain_ordered_text(mine.input) == plain_ordered_text(theirs.input)
    assert plain_ordered_text(mine.value) == plain_ordered_text(theirs.value)
    assert mine.fired == theirs.fired


@pytest.mark.parametrize("told", ["when-nothing-fired", "always", "a-wrong-digest"])
def test_asks_taken_as_given_are_the_asks_of_the_whole_way(told: str) -> None:
    scrub = Scrub(Redactor())
    given = 0
    for seed in range(300):
        whole = Contract(scrub, RFC8785.digest)
        theirs = _asks(whole, random.Random(seed))
        replayed = Contract(scrub, RFC8785.digest)
        queue: list[Expected | None] = []
        for _, ask in theirs:
            output = (
                whole.state_digest(ask, "closed")
                if ask.event_type == EventType.STATE_TRANSITION
                else ""
            )
            digest = "sha256:" + "0" * 64 if told == "a-wrong-digest" else ask.input_digest
            tell = told != "when-nothing-fired" or not ask.fired
            queue.append(Expected(ask.event_type, digest, output) if tell else None)
            given += tell and (told == "a-wrong-digest" or not ask.fired)
        asks = _asks_in_turn(replayed, random.Random(seed), queue)
        for (kind, ask), (_, their) in zip(asks, theirs, strict=True):
            _same(ask, their)
            if kind == "transition":
                assert replayed.state_digest(ask, "closed") == whole.state_digest(their, "closed")
    assert given > 200, "too few asks were told of to tell"


def _asks_in_turn(
    contract: Contract, rng: random.Random, queue: list[Expected | None]
) -> list[tuple[str, Any]]:
    """:func:`_asks`, the contract told of each recorded event in its turn."""
    told = iter(list(queue))
    contract.expected = lambda: current[0]
    current: list[Expected | None] = [next(told)]
    args = tuple(_value(rng) for _ in range(rng.randint(0, 2)))
    kwargs = {f"k{i}": _value(rng) for i in range(rng.randint(0, 2))}
    arguments = {"to": _value(rng), "body": _value(rng)}
    state, reason = _value(rng), rng.choice([None, "because " + rng.choice(SECRETS), "ok"])
    tool = contract.tool("lookup", args, kwargs)
    current[0] = next(told)
    intent = contract.intent("send_mail", "k-1", arguments)
    current[0] = next(told)
    transition = contract.transition("open", "closed", state, reason)
    return [("tool", tool), ("intent", intent), ("transition", transition)]


def _agent(leak: str | None) -> Any:
    def agent(run: AgentRun, input: Any) -> Any:
        for turn in range(4):
            customer = "frank.moss@example.org" if leak == "argument" and turn == 2 else "c-7"
            run.call("lookup", lambda who: {"who": who, "orders": 2}, customer)
            note = f"turn {turn}" + (" for frank.moss@example.org" if leak == "state" else "")
            run.transition(f"step-{turn}", state={"note": note, "turn": turn})
        return {"turns": 4}

    return agent


@pytest.mark.parametrize(
    ("leak", "kind"), [("argument", "argument_mismatch"), ("state", "state_mismatch")]
)
def test_a_crossing_that_diverges_is_reported_from_its_scrubbed_values(
    leak: str, kind: str
) -> None:
    recorder = MemoryRecorder()
    recorder.record(_agent(None), RunSnapshot(code_version="v1", input={}), agent_id="given")
    events = list(recorder.events)
    assert not any("redacted" in e.attributes for e in events), "the run fired a rule"
    assert replay_run(events, _agent(None), blobs=recorder).passed
    report = bb.replay(events, _agent(leak), reveal_values=True)
    assert report.divergence is not None
    assert report.divergence.kind.value == kind
    shown = json.dumps(
        [report.divergence.asked, [(c.expected, c.actual) for c in report.divergence.changes]],
        default=str,
    )
    assert "frank.moss@example.org" not in shown
    assert "frank.moss@example.org" not in report.divergence.describe()


@pytest.mark.parametrize("at", [1, 2, 3, 5])
def test_a_log_that_fails_to_read_fails_where_the_event_is_taken(
    at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replay reads one event ahead to know what the next call is compared with; an
    error reading the log still comes out where that event is taken, as without it."""
    recorder = MemoryRecorder()
    recorder.record(_agent(None), RunSnapshot(code_version="v1", input={}), agent_id="given")
    events = list(recorder.events)

    def broken() -> Any:
        for position, envelope in enumerate(events):
            if position == at:
                raise OSError(f"the archive went away at {position}")
            yield envelope

    outcomes = []
    for ahead in (True, False):
        if not ahead:
            monkeypatch.setattr(RecordedLog, "expected_crossing", lambda self: None)
        report = replay_run(broken(), _agent(None))
        outcomes.append((report.result, str(report.divergence)))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("told", ["when-nothing-fired", "always", "a-wrong-digest"])
def test_ends_taken_as_given_are_the_ends_of_the_whole_way(told: str) -> None:
    """A run's end is taken as given (its output not scrubbed) only when what
    ``run.finished`` records of it digests as recorded; the end comes out as the whole
    way gives it, in every body version, a refused output included."""
    scrub = Scrub(Redactor())
    given = 0
    for seed in range(300):
        rng = random.Random(seed)
        output = _value(rng) if rng.random() < 0.9 else {"mean": float("nan")}
        state = rng.choice([None, "sha256:" + "1" * 64])
        whole = Contract(scrub, RFC8785.digest)
        theirs = whole.finish("succeeded", output, None, state)
        recorded = whole.output_digest(theirs)
        replayed = Contract(scrub, RFC8785.digest)
        tell = told != "when-nothing-fired" or not theirs.fired
        digest = "sha256:" + "0" * 64 if told == "a-wrong-digest" else recorded
        expected = Expected(EventType.RUN_FINISHED, theirs.ask.input_digest, digest)
        replayed.expected = lambda expected=expected, tell=tell: expected if tell else None
        mine = replayed.finish("succeeded", output, None, state)
        plain = tell and not theirs.fired and not theirs.refused
        given += plain
        taken = plain and told != "a-wrong-digest"
        assert (mine.digest is not None) == taken
        _same(mine.ask, theirs.ask)
        assert (mine.status, mine.fired) == (theirs.status, theirs.fired)
        assert type(mine.refused) is type(theirs.refused)
        for version in (1, 2, 3):
            assert replayed.output_digest(mine, version=version) == whole.output_digest(
                theirs, version=version
            )
    assert given > 150, "too few ends were told of to tell"


def test_a_run_that_now_raises_says_so_at_its_end() -> None:
    """Recorded ending well, the code now raises after the same calls: the divergence at
    ``run.finished`` names the status that changed and how the code ended (it named
    neither: an argument mismatch with no detail)."""
    from agent_blackbox.testing import replay

    recorder = MemoryRecorder()

    def agent(run: AgentRun, city: Any) -> Any:
        return run.call("weather", lambda c: {"sky": "clear"}, city)

    def raising(run: AgentRun, city: Any) -> Any:
        run.call("weather", lambda c: {"sky": "clear"}, city)
        raise KeyError("sky")

    recorder.record(agent, RunSnapshot(code_version="v1", input="Oslo"), agent_id="w")
    divergence = replay(recorder, raising).divergence
    assert divergence is not None
    assert divergence.expected_type == "run.finished"
    assert divergence.detail == "the code ended raising KeyError"
    assert [(c.path, c.expected, c.actual) for c in divergence.changes] == [
        ("status", "succeeded", "failed")
    ]

    failed = MemoryRecorder()
    with pytest.raises(KeyError):
        failed.record(raising, RunSnapshot(code_version="v1", input="Oslo"), agent_id="w")
    back = replay(failed, agent).divergence
    assert back is not None
    assert back.detail == "the code ended without an error"
