"""Incremental LLM-call recording: a run's requests reuse the redaction, the canonical
texts and the digests of the parts its earlier requests already had
(``outbox._request_memo``), and every result is byte for byte what the whole way gives.

A property test over seeded random conversations (no hypothesis in the venv): messages
with secrets, e-mail addresses, card numbers, JSON inside strings, numbers of each JSON
type, keys out of order, tuples; requests whose root makes redaction depend on more than
a part (path rules, a credential or card key, a header); earlier messages edited in
place, removed, or the conversation forked; earlier messages changed into values that
``==`` holds equal but that are not alike (``1``, ``1.0`` and ``True``, keys in another
order, another class). Each is recorded with the memo and with the
memo turned off, and the stored events compared: payload bytes, digests, attributes
(the rules that fired among them).
"""

from __future__ import annotations

import base64
import json
import math
import random
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from agent_blackbox.outbox import AgentRun, MemoryRecorder, Redactor, RunSnapshot, _recording
from agent_blackbox.outbox._request_memo import Expected, RequestMemo
from agent_blackbox.outbox._scrub import Scrub
from agent_blackbox.outbox.contract import Contract
from agent_blackbox.replayer import replay_run
from agent_blackbox.schemas import (
    CANONICAL_V1,
    RFC8785,
    Envelope,
    EventType,
    KeyedDigest,
    NotSerialisable,
    Settings,
    canonical_text,
    object_text,
)

SECRETS = (
    "alice.smith@example.com",
    "sk-proj-" + "A1b2C3d4E5f6G7h8" * 3,
    "4111 1111 1111 1111",
    "AKIAIOSFODNN7EXAMPLE",
    "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlc2lnbmF0dXJl",
    "+44 20 7946 0958",
    "data:text/plain;base64," + base64.b64encode(b"api_key=sk-live-0123456789abcdef").decode(),
    "https://x.test/?api%5Fkey=sk-live-0123456789abcdefghij",
    "ghp_" + "x1Y2z3" * 6,
    "password=hunter2hunter2",
)
WORDS = [
    "the",
    "order",
    "was",
    "late",
    "and",
    "the",
    "customer",
    "asked",
    "for",
    "a",
    "refund",
    "of",
    "the",
    "second",
    "item",
]


def _text(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 30))]
    if rng.random() < 0.3:
        words.insert(rng.randint(0, len(words)), rng.choice(SECRETS))
    return " ".join(words)


def _scalar(rng: random.Random) -> Any:
    return rng.choice(
        [
            1,
            1.0,
            True,
            None,
            -0.0,
            0.0,
            2**60,
            4111111111111111,
            0.25,
            "short",
            rng.choice(SECRETS),
        ]
    )


def _message(rng: random.Random) -> dict[str, Any]:
    kind = rng.randrange(7)
    if kind == 0:
        return {"role": "user", "content": _text(rng)}
    if kind == 1:  # a tool result: JSON inside the string
        result = {"note": _text(rng), "amount": _scalar(rng), "card": _scalar(rng)}
        return {
            "role": "tool",
            "tool_call_id": f"call_{rng.randrange(99)}",
            "content": json.dumps(result),
        }
    if kind == 2:  # keys in another order, content blocks
        return {"content": [{"type": "text", "text": _text(rng)}], "role": "assistant"}
    if kind == 3:
        arguments = json.dumps({"order_id": _text(rng)[:20], "email": rng.choice(SECRETS)})
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == 4:  # a card's details inside a message, numbers of each type
        return {
            "role": "user",
            "content": _text(rng),
            "payment": {"number": _scalar(rng), "cvc": rng.choice([123, 1])},
        }
    if kind == 5:  # a tuple, and a header given as a pair
        return {
            "role": "user",
            "content": (_text(rng), _scalar(rng)),
            "h": ["Authorization", "x" * 9],
        }
    return {"role": "user", "name": "api_key", "value": _text(rng), "api_key": "k" * 12}


def _request(rng: random.Random, messages: list[Any], turn: int) -> dict[str, Any]:
    key = "input" if rng.random() < 0.15 else "messages"
    request: dict[str, Any] = {"model": "m-1", key: list(messages)}
    if rng.random() < 0.7:
        request["temperature"] = rng.choice([0.2, 1.0, 1, 0])
    if rng.random() < 0.6:
        request["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    if rng.random() < 0.5:
        request["system"] = "You are helpful. " + rng.choice(SECRETS)
    odd = rng.random()
    if odd < 0.05:
        request["api_key"] = "sk-" + "z" * 30  # a credential at the root
    elif odd < 0.10:
        request["cvc"] = 321  # the root holds a card's details
    elif odd < 0.15:
        request["name"], request["value"] = "Authorization", "Basic abc"  # a header
    elif odd < 0.20:
        request[key] = ["Authorization", "x" * 12]  # the turn list is a header
    elif odd < 0.25:
        request["metadata"] = {"user_id": f"u-{turn}", "card_number": 4111111111111111}
    return request


def _conversation(seed: int, turns: int) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    messages: list[Any] = [{"role": "system", "content": _text(rng)}]
    for turn in range(turns):
        for _ in range(rng.randint(1, 3)):
            messages.append(_message(rng))
        change = rng.random()
        if change < 0.1 and len(messages) > 2:  # an earlier message edited in place
            edited = rng.choice(messages[1:])
            if isinstance(edited, dict):
                edited["content"] = _text(rng)
        elif change < 0.15 and len(messages) > 3:  # one removed
            del messages[rng.randrange(1, len(messages))]
        elif change < 0.2 and len(messages) > 3:  # a fork from an earlier point
            messages = messages[: rng.randrange(1, len(messages))]
        elif change < 0.35 and len(messages) > 2:  # an earlier message, equal but not alike
            at = rng.randrange(1, len(messages))
            messages[at] = _alike(rng, messages[at])
        yield _request(rng, messages, turn)


class _Text(str):
    """A string subclass: equal to the string, written alike."""


def _alike(rng: random.Random, message: Any) -> Any:
    """``message`` changed into a value ``==`` holds equal to it: a number of another type
    (``1``, ``1.0`` and ``True`` are equal), its keys in another order (in place), a
    string or mapping of another class, the same items as a tuple."""
    if not isinstance(message, dict):
        return message
    payment = message.get("payment")
    way = rng.randrange(8)
    if way < 3 and isinstance(payment, dict):
        number = payment["cvc"]
        payment["cvc"] = float(number) if type(number) is int else int(number)
        if payment["cvc"] == 1:
            payment["cvc"] = rng.choice([1, 1.0, True])
    elif way < 6:
        items = list(message.items())
        message.clear()
        message.update(reversed(items))
    elif way == 6 and isinstance(message.get("content"), str):
        # marshal refuses a subclass: the requests holding it go the whole way
        message["content"] = _Text(message["content"])
    else:
        return OrderedDict(message) if rng.random() < 0.5 else message | {"h": ("a", "b")}
    return message


def _send(request: Mapping[str, Any]) -> dict[str, Any]:
    turns = request.get("messages") or request.get("input") or []
    text = f"answer to {len(turns)} turns" + (
        " mail bob@example.org" if len(turns) % 4 == 0 else ""
    )
    return {
        "id": f"r-{len(turns)}",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
    }


def _agent(seed: int, turns: int) -> Callable[[AgentRun, Any], Any]:
    def agent(run: AgentRun, input: Any) -> Any:
        for request in _conversation(seed, turns):
            run.llm(_send, request, provider="openai")
        return {"done": True}

    return agent


def _stored(envelope: Envelope) -> tuple[Any, ...]:
    """What must not differ between the two ways: the body's bytes, its encoding, the
    digests and the attributes (the rules that fired, the request's sizes)."""
    return (
        envelope.sequence,
        envelope.event_type,
        envelope.payload,
        envelope.payload_encoding,
        envelope.input_digest,
        envelope.output_digest,
        dict(envelope.attributes),
    )


def _recorded(recorder: MemoryRecorder, seed: int, turns: int) -> list[tuple[Any, ...]]:
    recorder.events.clear()
    snapshot = RunSnapshot(code_version="memo", input={"seed": seed})
    recorder.record(_agent(seed, turns), snapshot, agent_id="memo")
    return [_stored(e) for e in recorder.events]


@pytest.fixture
def whole_way(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """Turns the memo off (True) or on again (False). Calls take no time (a body
    records its call's latency, which would differ between the two recordings)."""
    monkeypatch.setattr(_recording.time, "perf_counter", lambda: 1.0)

    original = RequestMemo.asked

    def switch(off: bool) -> None:
        monkeypatch.setattr(RequestMemo, "asked", (lambda *_: None) if off else original)

    return switch


CONFIGS = [
    pytest.param({}, {}, id="default"),
    pytest.param({"canonical_json": "v1"}, {}, id="canonical-v1"),
    pytest.param({"llm_request_references": "off"}, {}, id="no-references"),
    pytest.param({"payload_compression": "none"}, {"version": 2}, id="redaction-v2"),
    pytest.param({}, {"version": 1}, id="redaction-v1"),
    pytest.param({}, {"paths": ["messages.*.content"]}, id="path-rule"),
]


@pytest.mark.parametrize(("settings", "rules"), CONFIGS)
def test_random_conversations_record_the_same_bytes_with_and_without_the_memo(
    settings: dict[str, str], rules: dict[str, Any], whole_way: Callable[[bool], None]
) -> None:
    recorder = MemoryRecorder(settings=Settings(**settings), redaction=Redactor(**rules))  # type: ignore[arg-type]
    for seed in range(8):
        whole_way(False)
        incremental = _recorded(recorder, seed, turns=14)
        whole_way(True)
        whole = _recorded(recorder, seed, turns=14)
        assert len(incremental) == len(whole) > 14
        for mine, theirs in zip(incremental, whole, strict=True):
            assert mine == theirs, f"seed {seed}, event {mine[0]}"
    fired = {e.attributes.get("redacted") for e in recorder.events}
    assert fired - {None}, "the conversations fired no rule: they test too little"


@pytest.mark.parametrize("canonical", [CANONICAL_V1, RFC8785], ids=["v1", "rfc8785"])
@pytest.mark.parametrize("pseudonyms", [(), ("email",)], ids=["placeholders", "pseudonyms"])
def test_keyed_asks_are_the_same_with_and_without_the_memo(
    canonical: Any, pseudonyms: tuple[str, ...]
) -> None:
    digest = KeyedDigest(b"k" * 32, canonical)
    scrub = Scrub(Redactor(pseudonyms=pseudonyms))
    memo, whole = Contract(scrub, digest), Contract(scrub, digest)
    whole.requests = _Off()  # type: ignore[assignment]
    asked = 0
    for seed in range(6):
        for request in _conversation(100 + seed, turns=12):
            mine, theirs = memo.llm("openai", None, request), whole.llm("openai", None, request)
            assert mine.input_digest == theirs.input_digest
            assert _same_value(mine.value, theirs.value)
            assert mine.input == theirs.input
            assert mine.fired == theirs.fired
            asked += memo.requests.parts_of(mine.value) is not None
    assert asked > 40, "the memo was used for too few requests to tell"


def _same_value(mine: Any, theirs: Any) -> bool:
    """Whether two asks' values are the same JSON. Their canonical texts are compared:
    an earlier message whose keys the agent put in another order in place keeps, in the
    memo's copy, the order it was first seen in; nothing recorded depends on key order.
    The values' types are compared too (``1``, ``1.0`` and ``True`` are written apart)."""
    return bool(canonical_text(mine) == canonical_text(theirs)) and _shape(mine) == _shape(theirs)


def _shape(value: Any) -> Any:
    if isinstance(value, Mapping):
        return sorted((name, _shape(item)) for name, item in value.items())
    if isinstance(value, list | tuple):
        return [_shape(item) for item in value]
    kind = "str" if isinstance(value, str) else type(value).__name__  # _Text is written alike
    return (kind, value.hex() if type(value) is float else value)


class _Off:
    def asked(self, *_: Any) -> None:
        return None

    def parts_of(self, _: Any) -> None:
        return None


def _spied_parts(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every value ``Scrub.part`` is handed from now on, in order."""
    walked: list[Any] = []
    part = Scrub.part

    def spied(self: Scrub, value: Any, *, level: int) -> Any:
        walked.append(value)
        return part(self, value, level=level)

    monkeypatch.setattr(Scrub, "part", spied)
    return walked


def test_each_request_redacts_only_the_parts_it_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    walked = _spied_parts(monkeypatch)
    contract = Contract(Scrub(Redactor()), RFC8785.digest)
    messages: list[dict[str, Any]] = []
    for turn in range(30):
        messages.append({"role": "user", "content": f"question {turn}: " + "word " * 200})
        request = {"model": "m", "messages": list(messages), "tools": [{"name": "f"}]}
        walked.clear()
        contract.llm("openai", None, request)
        # The first request walks its fields too; each later one its new message only.
        assert walked == (["m", request["tools"], messages[0]] if turn == 0 else [messages[-1]])


def test_a_request_that_goes_on_from_the_one_before_looks_up_only_its_new_turns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looked_up: list[Any] = []
    found = RequestMemo._found

    def counted(
        self: RequestMemo, value: Any, exact: bytes, level: int, now: int, taken: Any = None
    ) -> Any:
        if level == 2:
            looked_up.append(value)
        return found(self, value, exact, level, now, taken)

    monkeypatch.setattr(RequestMemo, "_found", counted)
    contract = Contract(Scrub(Redactor()), RFC8785.digest)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    asks = []
    for turn in range(6):
        messages.append({"role": "user", "content": f"question {turn}"})
        looked_up.clear()
        asks.append(contract.llm("openai", None, {"model": "m", "messages": list(messages)}))
        assert looked_up == (messages if turn == 0 else [messages[-1]])
    # A fork back to an earlier turn shares what it still has in common.
    looked_up.clear()
    fork = [*messages[:3], {"role": "user", "content": "another question"}]
    forked = contract.llm("openai", None, {"model": "m", "messages": fork})
    assert looked_up == [fork[-1]]
    whole = Contract(Scrub(Redactor()), RFC8785.digest).llm(
        "openai", None, {"model": "m", "messages": fork}
    )
    assert (forked.value, forked.input_digest) == (whole.value, whole.input_digest)


def test_an_earlier_message_changed_in_place_is_redacted_again() -> None:
    contract = Contract(Scrub(Redactor()), RFC8785.digest)
    messages = [{"role": "user", "content": "hello there"}, {"role": "user", "content": "x" * 10}]
    contract.llm("openai", None, {"model": "m", "messages": messages})
    messages[0]["content"] = "write to alice.smith@example.com"
    ask = contract.llm("openai", None, {"model": "m", "messages": messages})
    assert ask.value["messages"][0]["content"] == "write to [redacted:email]"
    assert "email" in ask.fired


@pytest.mark.parametrize(
    "bad",
    [float("nan"), {"deep": json.loads("[" * 120 + "]" * 120)}, "\ud800"],
    ids=["nan", "too-deep", "lone-surrogate"],
)
def test_a_request_that_cannot_be_recorded_fails_as_the_whole_way_fails(
    bad: Any, whole_way: Callable[[bool], None]
) -> None:
    errors = []
    for off in (False, True):
        whole_way(off)
        contract = Contract(Scrub(Redactor()), RFC8785.digest)
        contract.llm("openai", None, {"model": "m", "messages": [{"content": "fine words"}]})
        request = {"model": "m", "messages": [{"content": "fine words"}, {"content": bad}]}
        with pytest.raises((NotSerialisable, ValueError)) as raised:
            contract.llm("openai", None, request)
        errors.append((type(raised.value), str(raised.value)))
    assert errors[0] == errors[1]


class _Touchy:
    """Not JSON, and ``==`` raises (as an array's does when it cannot say)."""

    def __eq__(self, other: object) -> bool:
        raise TypeError("cannot compare")

    __hash__ = object.__hash__


def test_an_earlier_message_whose_equality_raises_fails_as_the_whole_way_fails(
    whole_way: Callable[[bool], None],
) -> None:
    errors = []
    for off in (False, True):
        whole_way(off)
        contract = Contract(Scrub(Redactor()), RFC8785.digest)
        messages: list[Any] = [{"content": "fine words"}, {"content": "more words"}]
        contract.llm("openai", None, {"model": "m", "messages": messages})
        messages[0] = _Touchy()  # where the memo holds a copy of the first message
        with pytest.raises(NotSerialisable) as raised:
            contract.llm("openai", None, {"model": "m", "messages": messages})
        errors.append(str(raised.value))
    assert errors[0] == errors[1]
    assert "messages[0]" in errors[0]


@pytest.mark.parametrize("canonical", ["v1", "rfc8785"])
def test_random_conversations_replay_their_requests_rebuilt_by_reference(canonical: str) -> None:
    recorder = MemoryRecorder(settings=Settings(canonical_json=canonical))
    for seed in range(6):  # forks and removals: requests continue only part of another
        recorder.events.clear()
        snapshot = RunSnapshot(code_version="memo", input={"seed": seed})
        recorder.record(_agent(seed, 14), snapshot, agent_id="memo")
        events = list(recorder.events)
        report = replay_run(events, _agent(seed, 14), blobs=recorder)
        assert report.passed, f"seed {seed}: {report.divergence}"


def test_replay_checks_each_request_against_its_recording() -> None:
    recorder = MemoryRecorder(settings=Settings())
    recorder.record(_agent(7, 12), RunSnapshot(code_version="memo", input={}), agent_id="memo")
    events = list(recorder.events)
    assert replay_run(events, _agent(7, 12), blobs=recorder).passed

    def changed(run: AgentRun, input: Any) -> Any:
        for turn, request in enumerate(_conversation(7, 12)):
            if turn == 9:  # a message the earlier requests had, changed in the replay
                turns = request.get("messages") or request["input"]
                turns[0] = {**turns[0], "content": "something else"}
            run.llm(_send, request, provider="openai")
        return {"done": True}

    report = replay_run(events, changed, blobs=recorder)
    assert not report.passed
    assert report.divergence is not None


@pytest.mark.parametrize("canonical", [CANONICAL_V1, RFC8785], ids=["v1", "rfc8785"])
@pytest.mark.parametrize("told", ["when-nothing-fired", "always", "with-what-fired"])
def test_requests_replay_takes_as_they_are_ask_what_the_whole_way_asks(
    canonical: Any, told: str
) -> None:
    """Replay tells the memo the recorded digest of a call no rule fired on, and the
    memo takes the request's new parts as they are. Told it for every call (``always``:
    as a body's attributes could not say), the calls whose parts redaction changes miss
    the digest and are scrubbed the whole way; told it for every call with whether a
    rule fired (``with-what-fired``, as replay tells it), the new parts holding no
    stand-in are taken: the asks stay the whole way's."""
    digest = canonical.digest
    scrub = Scrub(Redactor())
    whole = Contract(scrub, digest)
    whole.requests = _Off()  # type: ignore[assignment]
    replayed = Contract(scrub, digest)
    recorded: list[Expected | None] = [None]
    replayed.expected = lambda: recorded[0]
    taken = missed = 0
    for seed in range(16):
        conversation = _conversation if seed % 2 else _quiet_conversation
        for request in conversation(200 + seed, turns=10):
            theirs = whole.llm("openai", None, request)
            nothing_fired = not theirs.fired
            told_now = nothing_fired or told != "when-nothing-fired"
            fired = told == "with-what-fired" and not nothing_fired
            recorded[0] = _llm_call(theirs.input_digest, fired) if told_now else None
            mine = replayed.llm("openai", None, request)
            assert mine.input_digest == theirs.input_digest
            assert _same_value(mine.value, theirs.value)
            assert mine.input == theirs.input
            assert mine.fired == theirs.fired
            taken += told_now and nothing_fired
            missed += told_now and not nothing_fired
    assert taken > 10, "too few requests were taken as they are to tell"
    assert told == "when-nothing-fired" or missed > 10


def _llm_call(digest: str, fired: bool = False) -> Expected:
    return Expected(EventType.LLM_CALL, digest, "", fired)


def test_a_call_a_rule_fired_on_takes_its_new_turns_as_they_are_unless_one_holds_a_stand_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The e-mail address of the first turn fired a rule on every later call; the memo
    holds that turn scrubbed, so a later call's new turns are taken as they are, and
    only a turn that holds a stand-in's text (which a rule may have left) is scrubbed."""
    scrubbed = _spied_parts(monkeypatch)
    whole = Contract(Scrub(Redactor()), RFC8785.digest)
    whole.requests = _Off()  # type: ignore[assignment]
    replayed = Contract(Scrub(Redactor()), RFC8785.digest)
    recorded: list[Expected | None] = [None]
    replayed.expected = lambda: recorded[0]
    messages: list[Any] = [{"role": "user", "content": "mail alice.smith@example.com"}]
    new_turns = [
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "thanks, and the order?"},
        {"role": "user", "content": "it said [redacted:email] there"},
        {"role": "user", "content": "and [email:0123456789ab] here"},
    ]
    scrubbed_new: list[bool] = []
    for turn in [None, *new_turns]:
        if turn is not None:
            messages.append(turn)
        request = {"model": "m", "messages": list(messages)}
        theirs = whole.llm("openai", None, request)
        assert "email" in theirs.fired
        recorded[0] = _llm_call(theirs.input_digest, fired=True)
        scrubbed.clear()
        mine = replayed.llm("openai", None, request)
        assert mine.input_digest == theirs.input_digest
        assert mine.input == theirs.input
        assert mine.fired == theirs.fired
        if turn is not None:
            scrubbed_new.append(any(value is turn for value in scrubbed))
    assert scrubbed_new == [False, False, True, True]


def _quiet_conversation(seed: int, turns: int) -> Iterator[dict[str, Any]]:
    """Conversations most of whose messages no rule fires on (as most are): numbers of
    each JSON type, JSON inside strings, keys out of order, tuples; now and then one of
    :func:`_message`'s, a message edited in place or a fork."""
    rng = random.Random(seed)
    messages: list[Any] = [{"role": "system", "content": "be brief"}]
    for turn in range(turns):
        for _ in range(rng.randint(1, 3)):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20)))
            kind = rng.randrange(5)
            if kind == 0:
                message: Any = {"role": "user", "content": words}
            elif kind == 1:
                result = {"note": words, "amount": rng.choice([1, 1.0, -0.0, 2**60, 0.25])}
                message = {"role": "tool", "tool_call_id": "c", "content": json.dumps(result)}
            elif kind == 2:
                message = {"content": [{"type": "text", "text": words}], "role": "assistant"}
            elif kind == 3:
                message = {"role": "user", "content": (words, rng.choice([True, None, 7]))}
            else:
                message = _message(rng) if rng.random() < 0.3 else {"role": "user", "content": ""}
            messages.append(message)
        change = rng.random()
        if change < 0.1 and len(messages) > 2:
            edited = rng.choice(messages[1:])
            if isinstance(edited, dict):
                edited["content"] = "edited " + str(turn)
        elif change < 0.2 and len(messages) > 3:
            messages = messages[: rng.randrange(1, len(messages))]
        request: dict[str, Any] = {"model": "m-1", "messages": list(messages)}
        if rng.random() < 0.5:
            request["temperature"] = rng.choice([0.2, 1.0, 1, 0])
        yield request


def test_a_request_that_misses_its_recorded_digest_forgets_what_it_took_as_it_was() -> None:
    contract = Contract(Scrub(Redactor()), RFC8785.digest)
    contract.expected = lambda: _llm_call("sha256:" + "0" * 64)  # never matches
    messages = [{"role": "user", "content": "hello there"}]
    contract.llm("openai", None, {"model": "m", "messages": list(messages)})
    messages.append({"role": "user", "content": "write to alice.smith@example.com"})
    ask = contract.llm("openai", None, {"model": "m", "messages": list(messages)})
    assert ask.value["messages"][1]["content"] == "write to [redacted:email]"
    assert "email" in ask.fired
    # Asked again, told nothing: the message is found scrubbed, not as it was taken.
    contract.expected = None
    again = contract.llm("openai", None, {"model": "m", "messages": list(messages)})
    assert again.value["messages"][1]["content"] == "write to [redacted:email]"
    assert again.input_digest == ask.input_digest


def test_a_refused_request_forgets_what_it_took_as_it_was() -> None:
    contract = Contract(Scrub(Redactor()), RFC8785.digest)
    leaked = {"role": "user", "content": "write to alice.smith@example.com"}
    contract.expected = lambda: _llm_call("sha256:" + "0" * 64)
    with pytest.raises(NotSerialisable, match="not a finite number"):
        contract.llm("openai", None, {"model": "m", "messages": [leaked, {"content": math.nan}]})
    contract.expected = None
    ask = contract.llm("openai", None, {"model": "m", "messages": [leaked]})
    assert ask.value["messages"][0]["content"] == "write to [redacted:email]"


def test_a_replayed_request_that_diverges_is_reported_scrubbed() -> None:
    """A run whose calls fired no rule: its replay takes the requests as they are, and
    one that now holds an e-mail address diverges, reported from the scrubbed request."""

    def agent(leak: bool) -> Callable[[AgentRun, Any], Any]:
        def run_it(run: AgentRun, input: Any) -> Any:
            messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
            for turn in range(6):
                text = f"question {turn}"
                if leak and turn == 4:
                    text += " from carol.jones@example.net"
                messages.append({"role": "user", "content": text})
                run.llm(_quiet, {"model": "m", "messages": list(messages)}, provider="openai")
                messages.append({"role": "assistant", "content": f"answer {turn}"})
            return {"done": True}

        return run_it

    recorder = MemoryRecorder(settings=Settings())
    recorder.record(agent(False), RunSnapshot(code_version="memo", input={}), agent_id="memo")
    events = list(recorder.events)
    assert not any("redacted" in e.attributes for e in events)
    assert replay_run(events, agent(False), blobs=recorder).passed
    report = replay_run(events, agent(True), blobs=recorder, reveal_values=True)
    assert report.divergence is not None
    assert report.divergence.kind.value == "argument_mismatch"
    shown = json.dumps([report.divergence.asked, [c.actual for c in report.divergence.changes]])
    assert "carol.jones@example.net" not in shown
    assert "[redacted:email]" in shown


def _quiet(request: Mapping[str, Any]) -> dict[str, Any]:
    reply = {"role": "assistant", "content": f"answer {len(request['messages'])}"}
    return {"id": "r", "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}]}


def test_digests_of_canonical_bytes_are_the_digests_of_the_value() -> None:
    value = {"b": [1, 2.5, "é"], "a": {"z": None, "y": True}}
    for canonical in (CANONICAL_V1, RFC8785):
        keyed = KeyedDigest(b"q" * 32, canonical)
        data = canonical.json(value)
        assert keyed.of_canonical(data) == keyed(value)
        assert canonical.digest.of_canonical(data) == canonical.digest(value)
        members = {k: canonical.json(v).decode() for k, v in value.items()}
        text = object_text(members, code_point_keys=canonical.code_point_keys)
        assert text.encode() == data


class _CountingDigest:
    """RFC 8785's plain digest, counting the bytes its running digests are fed."""

    canonical = RFC8785

    def __init__(self) -> None:
        self.fed = 0

    def __call__(self, value: Any, *, path: str = "$") -> str:
        return RFC8785.digest(value, path=path)

    def under(self, canonical: Any) -> Any:
        return self

    def of_canonical(self, data: bytes) -> str:
        self.fed += len(data)
        return RFC8785.digest.of_canonical(data)

    def begin(self) -> _CountingRun:
        return _CountingRun(self, RFC8785.digest.begin())

    def finished(self, running: Any) -> str:
        return RFC8785.digest.finished(running.inner)


class _CountingRun:
    def __init__(self, owner: _CountingDigest, inner: Any) -> None:
        self.owner, self.inner = owner, inner

    def update(self, data: bytes, /) -> None:
        self.owner.fed += len(data)
        self.inner.update(data)

    def copy(self) -> _CountingRun:
        return _CountingRun(self.owner, self.inner.copy())

    def hexdigest(self) -> str:
        return str(self.inner.hexdigest())


def test_a_request_that_goes_on_from_the_one_before_digests_only_its_new_turns() -> None:
    counting = _CountingDigest()
    memo, whole = Contract(Scrub(Redactor()), counting), Contract(Scrub(Redactor()), counting)
    whole.requests = _Off()  # type: ignore[assignment]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief " * 100}]
    for turn in range(30):
        messages.append({"role": "user", "content": f"question {turn}: " + "word " * 200})
        request = {"model": "m", "messages": messages, "tools": [{"name": "f"}]}
        counting.fed = 0
        mine = memo.llm("openai", None, request)
        fed = counting.fed
        assert mine.input_digest == whole.llm("openai", None, request).input_digest
        # Turn 30's request is over 30 KB: each fed its new message and the closing.
        assert fed < (2_000 if turn else 3_000), (turn, fed)
