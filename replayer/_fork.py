"""Fork and re-execution: start again from a recorded run, on purpose differently.

A fork is a new run (its own run id, ``parent_run_id`` set, the list of changes in its
``run.started``) driven by the agent's code in record mode from the parent's input
snapshot, with the model called for real. Tools are answered from the parent's
recording where the call is the same; effects are refused or sent to a sandbox.

Re-execution re-sends each recorded raw LLM request as it was and compares what comes
back, call by call.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from sqlalchemy import Engine

from agent_blackbox.keystore import DataKeyStore
from agent_blackbox.outbox import (
    EffectPolicy,
    MemoryRecorder,
    RecordedError,
    Recorder,
    RefuseEffects,
    RunSnapshot,
    SandboxEffects,
    ToolPolicy,
    completion_view,
)
from agent_blackbox.outbox.contract import Contract, Scrub
from agent_blackbox.replayer._driver import AgentEntry
from agent_blackbox.replayer._replay import DigestKeys, run_digest
from agent_blackbox.schemas import (
    BlackboxError,
    Envelope,
    EventType,
    PayloadPipeline,
    Settings,
)

ForkFactory = Callable[..., AgentEntry]
"""``factory(snapshot, *, base_url=..., api_key=...) -> entry``: the agent, built as the
changed snapshot describes it, with a real model client."""

IGNORED_FIELDS = ("id", "created", "system_fingerprint")


class ForkError(BlackboxError):
    """A fork or re-execution could not start."""


class ToolNotRecorded(BlackboxError):
    """A re-execution called a tool with arguments its parent run never used."""


class RecordedTools:
    """Answers tool calls from a parent run's recording, matched by input digest.

    The digest of each call is built by the boundary contract, under the redaction rules
    and the digest the parent was recorded with, so a call the parent made matches
    however its arguments were scrubbed. A call the parent never made goes to
    ``fallback`` (live tools, say) or, without one, raises :class:`ToolNotRecorded`.
    """

    def __init__(
        self,
        parent: Iterable[Envelope],
        *,
        pipeline: PayloadPipeline | None = None,
        fallback: ToolPolicy | None = None,
        digests: DigestKeys | None = None,
    ) -> None:
        opener = pipeline or PayloadPipeline()
        self._answers: dict[str, dict[str, Any]] = {}
        envelopes = list(parent)
        first = envelopes[0] if envelopes else None
        scrub = Scrub(None) if first is None else Scrub.recorded_in(first.attributes)
        self._contract = Contract(scrub, run_digest(first, digests))
        for envelope in envelopes:
            if envelope.event_type == EventType.TOOL_CALL and envelope.payload is not None:
                body = opener.unpack(envelope)
                self._answers.setdefault(envelope.input_digest, body)
        self._fallback = fallback

    def call(
        self, tool: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], fn: Callable[..., Any]
    ) -> Any:
        body = self._answers.get(self._contract.tool(tool, args, kwargs).input_digest)
        if body is None:
            if self._fallback is None:
                raise ToolNotRecorded(
                    f"tool {tool} was called with arguments the parent run never used; "
                    "allow live tools for this re-execution to call it"
                )
            return self._fallback.call(tool, args, kwargs, fn)
        if body["error"] is not None:
            raise RecordedError(body["error"]["type"], body["error"]["message"])
        return json.loads(body["result_json"])


@dataclass(frozen=True, slots=True)
class ForkResult:
    """What a fork recorded."""

    run_id: str
    parent_run_id: str
    changes: Mapping[str, str]
    status: str
    output: Any
    error: str | None
    sandboxed_effects: Sequence[Mapping[str, Any]] = ()
    events: Sequence[Envelope] = ()
    """The fork's envelopes when it was recorded in memory (a dry run)."""


def parent_snapshot(events: Sequence[Envelope], pipeline: PayloadPipeline) -> RunSnapshot:
    """The input snapshot recorded in a run's ``run.started``."""
    if not events or events[0].event_type != EventType.RUN_STARTED:
        raise ForkError("the parent run does not start with run.started; it cannot be forked")
    body = pipeline.unpack(events[0])
    return RunSnapshot(
        code_version=body["code_version"],
        input=json.loads(body["input_json"]),
        prompt_templates={t["id"]: t["digest"] for t in body["prompt_templates"]},
        tool_schemas={t["name"]: t["version"] for t in body["tool_schemas"]},
        model_ids=tuple(body["model_ids"]),
        flags=dict(body["flags"]),
        permissions=tuple(body["permissions"]),
        parent_run_id=body["parent_run_id"],
        changes=dict(body["changes"]),
    )


def forked_snapshot(
    parent: RunSnapshot, parent_run_id: str, changes: Mapping[str, str]
) -> RunSnapshot:
    """``parent`` with ``changes`` applied: ``model`` replaces the model ids, ``flag.X``
    sets flag X, ``code_version`` names the code that runs now; every change (these and
    any other, such as ``prompt``) is recorded for the agent and for the reader."""
    flags = dict(parent.flags)
    model_ids = parent.model_ids
    code_version = parent.code_version
    for key, value in changes.items():
        if key == "model":
            model_ids = (value,)
        elif key == "code_version":
            code_version = value
        elif key.startswith("flag."):
            flags[key.removeprefix("flag.")] = value
    return replace(
        parent,
        code_version=code_version,
        model_ids=model_ids,
        flags=flags,
        parent_run_id=parent_run_id,
        changes=dict(changes),
    )


def fork_run(
    parent: Iterable[Envelope],
    factory: ForkFactory,
    *,
    changes: Mapping[str, str],
    base_url: str,
    api_key: str,
    effects: Literal["refuse", "sandbox"] = "refuse",
    engine: Engine | None = None,
    settings: Settings | None = None,
    pipeline: PayloadPipeline | None = None,
    keys: DataKeyStore | None = None,
    digests: DigestKeys | None = None,
) -> ForkResult:
    """Record a fork of ``parent``: into Postgres with ``engine`` (encrypted under its own
    data key with ``keys``), else in memory. ``pipeline`` opens the parent's bodies,
    ``digests`` gives its tenant's keyed digest when it was recorded with one."""
    opener = pipeline or PayloadPipeline()
    events = list(parent)
    snapshot = forked_snapshot(parent_snapshot(events, opener), events[0].run_id, changes)
    tools = RecordedTools(events, pipeline=opener, digests=digests)
    effect_policy: EffectPolicy = SandboxEffects() if effects == "sandbox" else RefuseEffects()
    recorder: Recorder | MemoryRecorder
    if engine is not None:
        recorder = Recorder(
            engine, settings=settings, tools=tools, effects=effect_policy, keys=keys
        )
    else:
        recorder = MemoryRecorder(settings=settings, tools=tools, effects=effect_policy)
    entry = factory(snapshot, base_url=base_url, api_key=api_key)
    run = recorder.start_run(snapshot, agent_id=events[0].agent_id, tenant_id=events[0].tenant_id)
    status, output, error = "succeeded", None, None
    try:
        output = run.drive(entry, snapshot.input)
    except Exception as exc:  # recorded as the fork's failure by drive()
        status, error = "failed", f"{type(exc).__name__}: {exc}"
    sandboxed = effect_policy.sent if isinstance(effect_policy, SandboxEffects) else []
    memory = recorder.events if isinstance(recorder, MemoryRecorder) else []
    return ForkResult(
        run.run_id, events[0].run_id, dict(changes), status, output, error, sandboxed, memory
    )


@dataclass(frozen=True, slots=True)
class CallDiff:
    """One re-sent LLM request: what changed in the answer."""

    sequence: int
    model: str
    changed: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    """Field → (recorded, now), for text, finish_reason, tool_calls and usage."""
    error: str | None = None

    @property
    def same(self) -> bool:
        return not self.changed and self.error is None


def reexecute(
    events: Iterable[Envelope],
    send: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    *,
    pipeline: PayloadPipeline | None = None,
) -> list[CallDiff]:
    """Re-send every recorded raw LLM request through ``send`` and diff the answers,
    ignoring ids, creation times and system fingerprints."""
    opener = pipeline or PayloadPipeline()
    diffs = []
    for envelope in events:
        if envelope.event_type != EventType.LLM_CALL:
            continue
        body = opener.unpack(envelope)
        if body["raw_request_json"] is None or _reduced(body):
            diffs.append(CallDiff(envelope.sequence, body["model"], error=_NOT_KEPT))
            continue
        request = json.loads(body["raw_request_json"])
        recorded = json.loads(body["raw_response_json"] or "null") or {}
        try:
            fresh = dict(send(request))
        except Exception as exc:  # the endpoint's failure is part of the comparison
            diffs.append(
                CallDiff(envelope.sequence, body["model"], error=f"{type(exc).__name__}: {exc}")
            )
            continue
        before, after = _comparable(completion_view(recorded)), _comparable(completion_view(fresh))
        changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        diffs.append(CallDiff(envelope.sequence, body["model"], changed))
    return diffs


_NOT_KEPT = (
    "recorded truncated over the blob ceiling: the whole request or response was not kept, "
    "so the call was not re-sent"
)


def _reduced(body: Mapping[str, Any]) -> bool:
    return body.get("body_truncated") is not None and body["raw_response_json"] is None


def _comparable(response: Mapping[str, Any]) -> dict[str, Any]:
    choices = response.get("choices") or []
    return {
        "text": [(c.get("message") or {}).get("content") for c in choices],
        "finish_reason": [c.get("finish_reason") for c in choices],
        "tool_calls": [_tool_calls(c) for c in choices],
        "usage": {
            k: v
            for k, v in (response.get("usage") or {}).items()
            if k in ("prompt_tokens", "completion_tokens", "total_tokens")
        },
    }


def _tool_calls(choice: Mapping[str, Any]) -> list[dict[str, Any]]:
    calls = (choice.get("message") or {}).get("tool_calls") or []
    out = []
    for call in calls:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            parsed = arguments  # compared as text when it is not JSON
        out.append({"type": call.get("type"), "name": function.get("name"), "arguments": parsed})
    return out


def openai_sender(base_url: str, api_key: str) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """Sends a raw chat-completion request with the official SDK (``openai`` extra)."""
    try:
        from openai import OpenAI
    except ImportError as exc:
        raise ForkError(
            "re-execution needs the openai SDK: pip install 'agent-blackbox[openai]'"
        ) from exc
    client = OpenAI(base_url=base_url, api_key=api_key)

    def send(request: Mapping[str, Any]) -> dict[str, Any]:
        # Re-send as recorded, to the API it was recorded from; a streamed call is asked
        # for whole, since only the folded answer is compared.
        arguments = {k: v for k, v in request.items() if k != "stream"}
        if "messages" in arguments:
            response: Any = client.chat.completions.create(**arguments)
        else:
            response = client.responses.create(**arguments)
        body: dict[str, Any] = response.model_dump(mode="json", exclude_unset=True)
        return body

    return send
