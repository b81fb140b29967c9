"""The recorder's half of conversation-aware request storage (see
:mod:`agent_blackbox.schemas._request_prefix`): an ``llm.call`` whose request repeats the
start of one of the run's latest requests is stored as a reference to it plus what is
new.

Requests are compared by the canonical texts of their parts, taken from the recorder's
own redacted copy of the request: what the agent does to its objects after the call
changes nothing here. Texts equal to the earlier request's are kept as that request's
objects, so a run holds one copy of its conversation however many calls repeat it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from agent_blackbox.outbox._boundaries import Crossing
from agent_blackbox.outbox._request_memo import RequestParts
from agent_blackbox.schemas import (
    CANONICAL_V1,
    REFERENCE_WINDOW,
    Canonicalisation,
    EventType,
    SplitRequest,
    digest_bytes,
)

MIN_SHARED_BYTES = 256
"""A request names an earlier one only when that saves at least this many bytes."""


@dataclass(frozen=True, slots=True)
class _Recorded:
    sequence: int
    split: SplitRequest


class RequestPrefixes:
    """The latest requests of one run, and how a new one is stored against them."""

    def __init__(self, *, enabled: bool = True, canonical: Canonicalisation = CANONICAL_V1) -> None:
        self.enabled = enabled
        self.canonical = canonical
        """The run's canonicalisation: a whole request's digest is taken over it."""
        self._recent: list[_Recorded] = []

    def shortened(
        self, crossing: Crossing, sequence: int, *, parts: RequestParts | None = None
    ) -> Crossing:
        """``crossing`` as it is stored as event ``sequence``: an llm.call's request by
        reference when it shares enough with one of the run's latest requests.
        ``parts`` are the request's when a :class:`RequestMemo` scrubbed it (its texts
        are then theirs, not written again).

        Every llm.call with a request is remembered for the calls after it; anything at
        ``sequence`` or later is forgotten first (a retried append re-prepares it).
        """
        recent = self._recent
        while recent and recent[-1].sequence >= sequence:
            recent.pop()
        if not self.enabled or crossing.event_type != EventType.LLM_CALL:
            return crossing
        request = crossing.input.get("request")
        whole = crossing.body.get("raw_request_json")
        if not isinstance(request, Mapping) or whole is None:
            return crossing
        if parts is not None and whole is parts.text(CANONICAL_V1):
            split: SplitRequest | None = parts.split()
        else:
            parts = None
            split = SplitRequest.checked(request, whole)
        if split is None:
            return crossing
        best, shared, saved = _best_match(split, recent)
        recent.append(_Recorded(sequence, split))
        del recent[:-REFERENCE_WINDOW]
        if best is None or saved < MIN_SHARED_BYTES:
            return crossing
        # What is the request's own, from the texts of its parts (put together as the
        # whole request's text is: SplitRequest.checked saw them give it back).
        own = {name: text for name, text in split.fields.items() if name not in shared}
        body = dict(crossing.body)
        body["raw_request_json"] = SplitRequest(own, split.key, split.items[best.items :]).text()
        body["request_prefix"] = {
            "sequence": best.sequence,
            "key": split.key or "",
            "items": best.items,
            "fields": sorted(shared),
            "request_sha256": self._request_sha256(request, whole, parts),
        }
        return replace(crossing, body=body)

    def _request_sha256(
        self, request: Mapping[str, Any], whole: str, parts: RequestParts | None
    ) -> str:
        """The digest of the whole request: of its text, which is its version 1
        canonical JSON, or of the request under the run's canonicalisation."""
        if self.canonical is CANONICAL_V1:
            return digest_bytes(whole.encode("utf-8"))
        if parts is not None:
            return parts.sha256(self.canonical)
        return self.canonical.digest(request, path="llm.request")

    def forget(self, sequence: int) -> None:
        """Never name event ``sequence`` (its request was not stored whole)."""
        self._recent = [r for r in self._recent if r.sequence != sequence]


@dataclass(frozen=True, slots=True)
class _Match:
    earlier: _Recorded
    items: int

    @property
    def sequence(self) -> int:
        return self.earlier.sequence


def _best_match(
    split: SplitRequest, recent: list[_Recorded]
) -> tuple[_Match | None, set[str], int]:
    """The earlier request sharing the most bytes with ``split``: (how it is named, the
    fields shared whole, bytes saved). Shared texts are swapped for the earlier ones."""
    best: _Match | None = None
    best_fields: set[str] = set()
    best_saved = 0
    for earlier in reversed(recent):
        old = earlier.split
        if old.key != split.key:
            continue
        count, saved = _shared_items(split.items, old.items)
        fields = {
            name
            for name, text in split.fields.items()
            if len(text) > 64 and old.fields.get(name) == text
        }
        saved += sum(len(split.fields[name]) for name in fields)
        if saved > best_saved:
            best, best_fields, best_saved = _Match(earlier, count), fields, saved
        if count and count == len(old.items):
            break  # continues the latest request of its conversation: nothing beats that
    if best is not None:
        _share(split, best.earlier.split, best.items)
    return best, best_fields, best_saved


def _shared_items(mine: list[str], theirs: list[str]) -> tuple[int, int]:
    """How many of ``theirs`` ``mine`` begins with, and their length."""
    if len(mine) >= len(theirs) and mine[: len(theirs)] == theirs:
        # Most often: the earlier request whole, compared in one step (the texts it
        # shares are mostly the same objects, and equal at once).
        return len(theirs), sum(map(len, theirs))
    count = saved = 0
    for text, other in zip(mine, theirs, strict=False):
        if text != other:
            break
        count += 1
        saved += len(other)
    return count, saved


def _share(split: SplitRequest, earlier: SplitRequest, items: int) -> None:
    """Hold the texts ``split`` shares with ``earlier`` as ``earlier``'s objects."""
    split.items[:items] = earlier.items[:items]
    for name, text in split.fields.items():
        if earlier.fields.get(name) == text:
            split.fields[name] = earlier.fields[name]
