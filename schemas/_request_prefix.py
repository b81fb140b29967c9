"""Conversation-aware storage of LLM requests: a request that repeats an earlier
request of its run is stored as a reference to it plus what is new.

An agent re-sends the whole conversation on every call, so turn 1 of a 50-turn
conversation is in 50 requests. The recorder (``outbox``) stores a request as

- ``request_prefix``: the sequence of an earlier ``llm.call`` of the same run, how many
  leading items of its turn list (``messages``, or a Responses API ``input``) this
  request shares, the top-level fields it shares whole (``tools``, ``system``...), and
  the SHA-256 of the whole request's canonical JSON (under the run's canonicalisation);
- ``raw_request_json``: the request without those (the list holds the new items only).

Readers rebuild the whole request, byte for byte, with a :class:`RequestMemory`: it
keeps the requests of the last llm.calls of the runs being read and splices the shared
part back in, then checks the rebuilt request against the digest. Stored texts are
version 1 canonical JSON, a deterministic function of the value, so the rebuilt text is
assembled from the texts of the parts (:func:`assemble`) without encoding the whole
request again; in a run of version 1 its SHA-256 is the digest, in a run of another
canonicalisation the request it reads as is digested under that one.

A reference points at most :data:`REFERENCE_WINDOW` llm.calls back, so a reader reading
a run in order always holds what it needs; one that starts in the middle (a single
event's body) asks for the events it lacks (:class:`RequestPrefixMissing`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any, Final

from agent_blackbox.schemas._canonical import (
    canonical_text,
    digest_bytes,
    encoded_parts,
    object_text,
)
from agent_blackbox.schemas._digests import CANONICAL_V1, Canonicalisation
from agent_blackbox.schemas._errors import UndecodableMessage

REFERENCE_WINDOW: Final = 8
"""How many llm.calls of its run back a request may name (the recorder compares a new
request with this many of the latest; readers keep as many)."""

TURN_KEYS: Final = ("messages", "input")
"""Request fields that hold the conversation's turns: chat completions and Anthropic
messages (``messages``), the Responses API (``input``)."""

RUNS_HELD: Final = 256
"""How many runs a :class:`RequestMemory` keeps requests of (least recently read go
first): readers that interleave more runs than this lose the oldest."""


class RequestPrefixMissing(UndecodableMessage):
    """A stored request names an earlier llm.call that this reader has not read.

    ``needed`` is that event's sequence: read it (through the same pipeline) and open
    this one again.
    """

    def __init__(self, run_id: str, sequence: int, needed: int) -> None:
        self.run_id, self.sequence, self.needed = run_id, sequence, needed
        super().__init__(
            f"run {run_id} sequence {sequence}: the request continues the request of "
            f"llm.call {needed}, which was not read first; read the run in order "
            "(replay, export and the console do)"
        )


def turn_key(request: Mapping[str, Any]) -> str | None:
    """The field of ``request`` that holds its list of turns, if it has one."""
    for key in TURN_KEYS:
        if isinstance(request.get(key), list):
            return key
    return None


def assemble(fields: Mapping[str, str], key: str | None, items: Sequence[str]) -> str:
    """The canonical JSON of a request from the canonical texts of its parts: ``fields``
    maps each top-level field but the turn list to its value's text, ``items`` are the
    texts of the turn list's items (under ``key``)."""
    parts = dict(fields)
    if key is not None:
        parts[key] = "[" + ",".join(items) + "]"
    return "{" + ",".join(f"{encode_basestring(k)}:{parts[k]}" for k in sorted(parts)) + "}"


@dataclass(slots=True)
class SplitRequest:
    """A request as the canonical texts of its parts (what references are spliced from)."""

    fields: dict[str, str]
    key: str | None
    items: list[str]
    written: tuple[str, list[str]] | None = None
    """A reader's: the items' canonical JSON under the canonicalisation it names."""

    @classmethod
    def of(cls, request: Mapping[str, Any], *, path: str = "llm.request") -> SplitRequest:
        key = turn_key(request)
        fields = {
            name: canonical_text(value, path=f"{path}.{name}")
            for name, value in request.items()
            if name != key
        }
        items = [] if key is None else [canonical_text(item, path=path) for item in request[key]]
        return cls(fields, key, items)

    @classmethod
    def checked(cls, request: Mapping[str, Any], text: str) -> SplitRequest | None:
        """``request``, whose canonical JSON is ``text``, split into parts; None when
        the parts do not put ``text`` back together (a value the fast encoder writes
        otherwise: the request is then stored whole)."""
        key = turn_key(request)
        names = [name for name in request if name != key]
        values: list[Any] = [request[name] for name in names]
        items: list[Any] = [] if key is None else list(request[key])
        texts = encoded_parts(values + items)
        if texts is None:
            return None
        split = cls(dict(zip(names, texts[: len(names)], strict=True)), key, texts[len(names) :])
        return split if split.text() == text else None

    def text(self) -> str:
        return assemble(self.fields, self.key, self.items)


@dataclass(slots=True)
class _Held:
    """One llm.call's request as a reader holds it: its text until a later request
    references it, then split into parts."""

    text: str | None
    split: SplitRequest | None = None

    def parts(self) -> SplitRequest:
        if self.split is None:
            assert self.text is not None
            parsed = json.loads(self.text)
            self.split = SplitRequest.checked(parsed, self.text) or SplitRequest.of(parsed)
            self.text = None
        return self.split


@dataclass(slots=True)
class _Run:
    calls: OrderedDict[int, _Held] = field(default_factory=OrderedDict)
    lost: dict[int, str] = field(default_factory=dict)
    """llm.calls whose bodies did not open, and why: what names them cannot be rebuilt."""
    texts: dict[str, str] = field(default_factory=dict)
    """The canonical JSON (under the run's canonicalisation, when not version 1) of each
    part of the latest request rebuilt, by the part's version 1 text."""

    def hold(self, sequence: int, held: _Held) -> None:
        calls = self.calls
        calls[sequence] = held
        calls.move_to_end(sequence)
        while len(calls) > REFERENCE_WINDOW:
            calls.popitem(last=False)


class RequestMemory:
    """The requests of the latest llm.calls of the runs a reader reads, to rebuild the
    requests stored by reference. Not shared between threads."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, _Run] = OrderedDict()

    def _run(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _Run()
            while len(self._runs) > RUNS_HELD:
                self._runs.popitem(last=False)
        else:
            self._runs.move_to_end(run_id)
        return run

    def lost(self, run_id: str, sequence: int, why: str) -> None:
        """Note that llm.call ``sequence`` of ``run_id`` did not open (``why``), so that
        a request naming it says so."""
        lost = self._run(run_id).lost
        lost[sequence] = why
        while len(lost) > REFERENCE_WINDOW:
            del lost[next(iter(lost))]

    def read(
        self,
        run_id: str,
        sequence: int,
        body: dict[str, Any],
        canonical: Canonicalisation = CANONICAL_V1,
        *,
        known: SplitRequest | None = None,
    ) -> dict[str, Any]:
        """``body`` (an llm.call at the newest version) with its whole request; the
        request is remembered for the llm.calls after it. ``canonical`` is the run's
        canonicalisation, that the whole request's digest was taken over.

        ``known`` is a request the caller holds that may be the recorded one (replay's:
        the request the agent's code just made, whose input digest matched). When the
        stored parts are its parts, text for text, it is the request: nothing is
        rebuilt or digested again, and a body stored by reference is handed back as
        stored (its ``raw_request_json`` the part its request adds to the one
        ``request_prefix`` names), since the caller has the whole request and replay
        never reads it. Else ``known`` is ignored.

        Raises:
            RequestPrefixMissing: the request names an llm.call not read before.
            UndecodableMessage: the rebuilt request does not match its digest.
        """
        prefix = body.get("request_prefix")
        text = body.get("raw_request_json")
        run = self._run(run_id)
        if prefix is None:
            if text is not None:
                same = known is not None and known.text() == text
                run.hold(sequence, _Held(None, known) if same else _Held(text))
            return body
        where = f"run {run_id} sequence {sequence}"
        earlier = run.calls.get(prefix["sequence"])
        if earlier is None and prefix["sequence"] in run.lost:
            raise UndecodableMessage(
                f"{where}: the request continues the request of llm.call "
                f"{prefix['sequence']}, whose body did not open ({run.lost[prefix['sequence']]})"
            )
        if earlier is None:
            raise RequestPrefixMissing(run_id, sequence, prefix["sequence"])
        if text is None:
            raise UndecodableMessage(f"{where}: a request stored by reference has no own part")
        parts = earlier.parts()
        if known is not None and _continues(parts, text, prefix, known):
            run.hold(sequence, _Held(None, known))
            return body
        split = _spliced(parts, json.loads(text), prefix, where)
        whole = split.text()
        continued = (parts, prefix["items"])
        if _split_sha256(split, whole, canonical, run, continued) != prefix["request_sha256"]:
            raise UndecodableMessage(
                f"{where}: the request rebuilt from llm.call {prefix['sequence']} does not "
                "match its recorded digest; the run's events are not those it was recorded "
                "with"
            )
        run.hold(sequence, _Held(None, split))
        return {**body, "raw_request_json": whole, "request_prefix": None}


def _request_sha256(whole: str, canonical: Canonicalisation) -> str:
    """The digest of the request whose version 1 canonical JSON is ``whole``."""
    if canonical is CANONICAL_V1:
        return digest_bytes(whole.encode("utf-8"))
    return canonical.digest(json.loads(whole))


def _split_sha256(
    split: SplitRequest,
    whole: str,
    canonical: Canonicalisation,
    run: _Run,
    continued: tuple[SplitRequest, int],
) -> str:
    """:func:`_request_sha256` of ``whole``, the text of ``split``, which continues the
    first ``count`` items of ``earlier`` (``continued``): under another canonicalisation
    than version 1, the request's canonical JSON is put together from its parts', and
    the items it shares with ``earlier`` are not written again."""
    if canonical is CANONICAL_V1:
        return _request_sha256(whole, canonical)

    def write(text: str) -> str:
        return canonical.json(json.loads(text)).decode("utf-8")

    known = run.texts
    run.texts = {text: known.get(text) or write(text) for text in split.fields.values()}
    members = {name: run.texts[text] for name, text in split.fields.items()}
    if split.key is not None:
        earlier, count = continued
        if earlier.written is None or earlier.written[0] != canonical.name:
            earlier.written = (canonical.name, [write(item) for item in earlier.items])
        items = earlier.written[1][:count] + [write(item) for item in split.items[count:]]
        split.written = (canonical.name, items)
        members[split.key] = "[" + ",".join(items) + "]"
    code_points = canonical.code_point_keys
    return digest_bytes(object_text(members, code_point_keys=code_points).encode("utf-8"))


def _continues(
    earlier: SplitRequest, own: str, prefix: Mapping[str, Any], known: SplitRequest
) -> bool:
    """Whether ``known`` is the request stored as ``own`` (the text of its own part)
    continuing ``earlier`` as ``prefix`` says: its shared fields and first items are
    ``earlier``'s texts, and the rest is ``own``. Then splicing would rebuild ``known``
    exactly (the texts are the version 1 texts it is assembled from)."""
    key, count, shared = prefix["key"] or None, prefix["items"], prefix["fields"]
    if known.key != key or earlier.key != key:
        return False
    if count > len(earlier.items) or count > len(known.items):
        return False
    for name in shared:
        mine = known.fields.get(name)
        if mine is None or earlier.fields.get(name) != mine:
            return False
    if earlier.items[:count] != known.items[:count]:
        return False
    fields = {name: value for name, value in known.fields.items() if name not in shared}
    return assemble(fields, key, known.items[count:]) == own


def _spliced(
    earlier: SplitRequest, own: Any, prefix: Mapping[str, Any], where: str
) -> SplitRequest:
    """The request whose own part is ``own`` and whose shared part is ``earlier``'s."""
    key, count = prefix["key"] or None, prefix["items"]
    if not isinstance(own, dict) or earlier.key != key or count > len(earlier.items):
        raise UndecodableMessage(
            f"{where}: the request's reference to llm.call {prefix['sequence']} does not fit "
            "that request"
        )
    fields = {name: canonical_text(value) for name, value in own.items() if name != key}
    for name in prefix["fields"]:
        if name not in earlier.fields or name in fields:
            raise UndecodableMessage(
                f"{where}: shared field {name!r} is not in llm.call {prefix['sequence']}"
            )
        fields[name] = earlier.fields[name]
    if key is None:
        return SplitRequest(fields, None, [])
    new = own.get(key)
    if not isinstance(new, list):
        raise UndecodableMessage(f"{where}: the request's own part has no {key} list")
    items = earlier.items[:count] + [canonical_text(item) for item in new]
    return SplitRequest(fields, key, items)
