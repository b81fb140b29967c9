"""What a fork changed: its output, tool calls and LLM calls next to its parent's.

The parent's side is read from its recorded bodies, the fork's from what its run
answered; both are put in one shape first (tool arguments as the parent's bodies hold
them, LLM answers folded through ``completion_view``), so only real changes show.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent_blackbox.outbox import completion_view
from agent_blackbox.outbox.contract import Scrub
from agent_blackbox.schemas import Envelope, EventType, PayloadPipeline, refusing_plaintext

if TYPE_CHECKING:
    from agent_blackbox.replayer._fork import ForkResult

USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")
"""The usage counts compared (chat-completion names; Responses API counts are mapped)."""

_RESPONSES_USAGE = {
    "input_tokens": "prompt_tokens",
    "output_tokens": "completion_tokens",
    "total_tokens": "total_tokens",
}


def llm_summary(response: Mapping[str, Any] | None) -> dict[str, Any]:
    """The comparable content of a raw LLM response (plain, streamed or Responses API):
    the text and finish reason of each choice, its tool calls by name and parsed
    arguments, and the token usage. Ids, creation times and fingerprints are left out."""
    view = completion_view(response or {})
    choices = view.get("choices") or []
    return {
        "text": [(c.get("message") or {}).get("content") for c in choices],
        "finish_reason": [c.get("finish_reason") for c in choices],
        "tool_calls": [_tool_calls(c) for c in choices],
        "usage": _usage(view.get("usage")),
    }


def _usage(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    named = {_RESPONSES_USAGE.get(k, k): v for k, v in usage.items()}
    return {k: named[k] for k in USAGE_FIELDS if k in named}


def _tool_calls(choice: Mapping[str, Any]) -> list[dict[str, Any]]:
    calls = (choice.get("message") or {}).get("tool_calls") or []
    out = []
    for call in calls:
        kind = call.get("type") or "function"
        detail = call.get(kind) or call.get("function") or {}
        arguments = detail.get("arguments", detail.get("input"))
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            parsed = arguments  # compared as text when it is not JSON
        out.append({"name": detail.get("name"), "arguments": parsed})
    return out


@dataclass(frozen=True, slots=True)
class Change:
    """One place where two JSON values differ: a path (``$.a[0].b``) and both values;
    a value missing on one side is None with ``missing`` naming that side."""

    path: str
    parent: Any
    fork: Any
    missing: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "parent": self.parent,
            "fork": self.fork,
            "missing": self.missing,
        }


def changes_between(parent: Any, fork: Any, path: str = "$") -> list[Change]:
    """Where ``fork`` differs from ``parent``, key by key and item by item."""
    if isinstance(parent, Mapping) and isinstance(fork, Mapping):
        found: list[Change] = []
        for key in sorted(set(parent) | set(fork), key=str):
            where = f"{path}.{key}"
            if key not in fork:
                found.append(Change(where, parent[key], None, "fork"))
            elif key not in parent:
                found.append(Change(where, None, fork[key], "parent"))
            else:
                found += changes_between(parent[key], fork[key], where)
        return found
    if isinstance(parent, list) and isinstance(fork, list) and len(parent) == len(fork):
        return [
            c
            for i, pair in enumerate(zip(parent, fork, strict=True))
            for c in changes_between(*pair, f"{path}[{i}]")
        ]
    return [] if parent == fork else [Change(path, parent, fork)]


@dataclass(frozen=True, slots=True)
class CallPair:
    """The parent's and the fork's call at one position (None where one made fewer)."""

    index: int
    parent: Mapping[str, Any] | None
    fork: Mapping[str, Any] | None
    changed: Sequence[str] = ()
    """The fields that differ (all of them when one side is missing)."""

    @property
    def same(self) -> bool:
        return not self.changed

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "same": self.same,
            "changed": list(self.changed),
            "parent": self.parent,
            "fork": self.fork,
        }


@dataclass(frozen=True, slots=True)
class ForkDiff:
    """A fork next to its parent."""

    run_id: str
    parent_run_id: str
    status: tuple[str, str]
    """(parent, fork)."""
    output: tuple[Any, Any]
    """(parent, fork), the fork's scrubbed under the parent's redaction rules."""
    output_changes: Sequence[Change] = ()
    tool_calls: Sequence[CallPair] = ()
    llm_calls: Sequence[CallPair] = ()
    errors: tuple[str | None, str | None] = (None, None)

    @property
    def same(self) -> bool:
        return (
            self.status[0] == self.status[1]
            and not self.output_changes
            and all(p.same for p in (*self.tool_calls, *self.llm_calls))
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "same": self.same,
            "status": {"parent": self.status[0], "fork": self.status[1]},
            "error": {"parent": self.errors[0], "fork": self.errors[1]},
            "output": {
                "parent": self.output[0],
                "fork": self.output[1],
                "changes": [c.to_dict() for c in self.output_changes],
            },
            "tool_calls": [p.to_dict() for p in self.tool_calls],
            "llm_calls": [p.to_dict() for p in self.llm_calls],
        }


def fork_diff(
    parent: Iterable[Envelope], fork: ForkResult, *, pipeline: PayloadPipeline | None = None
) -> ForkDiff:
    """``fork`` next to the recorded ``parent`` (its envelopes, opened with ``pipeline``)."""
    opener = pipeline or PayloadPipeline()
    envelopes = list(refusing_plaintext(parent))
    scrub = Scrub.recorded_in(envelopes[0].attributes) if envelopes else Scrub(None)
    recorded = _Recorded.read(envelopes, opener)
    fork_tools = [
        {
            "tool": u.tool,
            "arguments": u.arguments,
            "result": u.result,
            "error": _type(u.error),
            "source": u.source,
        }
        for u in fork.tool_calls
    ]
    fork_llm = [
        {"model": u.model, **llm_summary(u.response), "error": _type(u.error)}
        for u in fork.llm_calls
    ]
    output = scrub.value(fork.output, set())
    return ForkDiff(
        run_id=fork.run_id,
        parent_run_id=fork.parent_run_id,
        status=(recorded.status, fork.status),
        output=(recorded.output, output),
        output_changes=changes_between(recorded.output, output),
        tool_calls=_pairs(recorded.tools, fork_tools, ignore=("source",)),
        llm_calls=_pairs(recorded.llm, fork_llm, ignore=()),
        errors=(recorded.error, fork.error),
    )


def _type(error: str | None) -> str | None:
    """The exception type of ``"Type: message"`` (messages differ between a recorded and
    a live failure of the same kind; the type is what is compared)."""
    return None if error is None else error.partition(":")[0]


def _pairs(
    parent: Sequence[Mapping[str, Any]],
    fork: Sequence[Mapping[str, Any]],
    *,
    ignore: tuple[str, ...],
) -> list[CallPair]:
    pairs = []
    for index in range(max(len(parent), len(fork))):
        before = parent[index] if index < len(parent) else None
        after = fork[index] if index < len(fork) else None
        if before is None or after is None:
            present = before or after or {}
            changed = [k for k in present if k not in ignore]
        else:
            fields = [k for k in {**before, **after} if k not in ignore]
            changed = [k for k in fields if before.get(k) != after.get(k)]
        pairs.append(CallPair(index, before, after, changed))
    return pairs


@dataclass
class _Recorded:
    status: str = "unfinished"
    output: Any = None
    error: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    llm: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def read(cls, envelopes: Sequence[Envelope], opener: PayloadPipeline) -> _Recorded:
        found = cls()
        for envelope in envelopes:
            kind = envelope.event_type
            if envelope.payload is None or kind not in _READ:
                continue
            body = opener.unpack(envelope)
            if kind == EventType.TOOL_CALL:
                found.tools.append(_recorded_tool(body))
            elif kind == EventType.LLM_CALL:
                found.llm.append(_recorded_llm(body))
            else:
                found.status = str(body["status"])
                found.output = json.loads(body["output_json"] or "null")
                found.error = _error_of(body)
        return found


_READ = frozenset({EventType.TOOL_CALL, EventType.LLM_CALL, EventType.RUN_FINISHED})


def _error_of(body: Mapping[str, Any]) -> str | None:
    error = body.get("error")
    return None if error is None else f"{error['type']}: {error['message']}"


def _recorded_tool(body: Mapping[str, Any]) -> dict[str, Any]:
    result = body.get("result_json")
    return {
        "tool": body["tool"],
        "arguments": json.loads(body["arguments_json"]),
        "result": None if result is None else json.loads(result),
        "error": _type(_error_of(body)),
    }


def recorded_response(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The raw response an ``llm.call`` body recorded (None when the call failed)."""
    raw = body.get("raw_response_json")
    return None if raw is None else dict(json.loads(raw))


def _recorded_llm(body: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "model": body["model"],
        **llm_summary(recorded_response(body)),
        "error": _type(_error_of(body)),
    }
