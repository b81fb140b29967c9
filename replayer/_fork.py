"""Fork and re-execution: start again from a recorded run, on purpose differently.

A fork is a new run (its own run id, ``parent_run_id`` set, the list of changes in its
``run.started``) driven by the agent's code in record mode from the parent's input
snapshot, with the model called for real. Tools are answered from the parent's
recording, live, or from the recording until the fork's calls differ from the parent's
(:data:`ToolMode`); effects are refused or sent to a sandbox. What the fork did is kept
beside its events, for the comparison with its parent (``_fork_diff.py``), and
:func:`fork_replay_entry` replays a fork through the factory that built it.

Re-execution (``_reexecute.py``) re-sends each recorded raw LLM request and compares
what comes back, call by call.
"""

from __future__ import annotations

import inspect
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Literal, TypeVar

from sqlalchemy import Engine

from agent_blackbox.keystore import DataKeyStore
from agent_blackbox.outbox import (
    AgentRun,
    AsyncMemoryRecorder,
    AsyncRecorder,
    AsyncRun,
    EffectPolicy,
    LiveTools,
    MemoryRecorder,
    Recorder,
    RecorderConfig,
    RefuseEffects,
    Run,
    RunSnapshot,
    SandboxEffects,
    ToolPolicy,
    rebuild_error,
    recorded_value,
)
from agent_blackbox.outbox.contract import Contract, Scrub, in_force
from agent_blackbox.replayer._divergence import ReplaySetupError
from agent_blackbox.replayer._driver import AgentEntry, _in_own_loop, is_async_entry
from agent_blackbox.replayer._opening import DigestKeys, run_digest
from agent_blackbox.schemas import (
    TAG_PREFIX,
    BlackboxError,
    Envelope,
    EventType,
    PayloadPipeline,
    Settings,
    refusing_plaintext,
    run_tags,
)
from agent_blackbox.wiring import COMMAND_POOL

ForkFactory = Callable[..., AgentEntry]
"""``factory(snapshot, *, base_url=..., api_key=...) -> entry``: the agent, built as the
changed snapshot describes it, with a real model client."""


class ForkError(BlackboxError):
    """A fork or re-execution could not start."""


class ToolNotRecorded(BlackboxError):
    """A fork called a tool with arguments its parent run never used, and its tools are
    answered from the parent's recording only."""


ToolMode = Literal["recorded", "live", "recorded-then-live"]
"""How a fork's tool calls are answered: ``recorded`` from the parent's recording only,
``live`` by calling the tools, ``recorded-then-live`` from the recording while the fork's
tool calls are the parent's, one for one in order, and live from the first that differs."""

TOOL_MODES: tuple[ToolMode, ...] = ("recorded", "live", "recorded-then-live")


@dataclass(frozen=True, slots=True)
class ToolUse:
    """One tool call of a fork, as its tool policy answered it."""

    tool: str
    arguments: Any
    """The call's input as the parent's ``tool.call`` bodies hold it (scrubbed under the
    parent's redaction rules), so the two compare like with like."""
    source: Literal["recorded", "live", "unrecorded"]
    result: Any = None
    error: str | None = None
    """``"Type: message"`` when the call raised."""


class RecordedTools:
    """Answers a fork's tool calls from its parent's recording, live, or both.

    A call is matched to the parent's by input digest, built by the boundary contract
    under the redaction rules and the digest the parent was recorded with, so a call the
    parent made matches however its arguments were scrubbed. In mode ``recorded`` a call
    the parent never made goes to ``fallback`` (live tools, say) or, without one, raises
    :class:`ToolNotRecorded`; in mode ``live`` every call goes to ``fallback``; in mode
    ``recorded-then-live`` the fork's calls are matched to the parent's in order and,
    from the first that differs, go to ``fallback``. What each call was answered with is
    kept in :attr:`uses`. Safe to call from several threads of one run.
    """

    def __init__(
        self,
        parent: Iterable[Envelope],
        *,
        pipeline: PayloadPipeline | None = None,
        fallback: ToolPolicy | None = None,
        digests: DigestKeys | None = None,
        mode: ToolMode = "recorded",
    ) -> None:
        if mode != "recorded" and fallback is None:
            raise ForkError(f"tools {mode!r} need a live fallback (LiveTools(), say)")
        opener = pipeline or PayloadPipeline()
        envelopes = list(refusing_plaintext(parent))
        first = envelopes[0] if envelopes else None
        scrub = Scrub(None) if first is None else Scrub.recorded_in(first.attributes)
        self._contract = Contract(scrub, run_digest(first, digests))
        self._recorded = [
            (envelope.input_digest, opener.unpack(envelope))
            for envelope in envelopes
            if envelope.event_type == EventType.TOOL_CALL and envelope.payload is not None
        ]
        # The same call may have been answered differently over the run (a status
        # polled until done): its answers are given back in the order recorded.
        self._answers: dict[str, list[dict[str, Any]]] = {}
        for input_digest, body in self._recorded:
            self._answers.setdefault(input_digest, []).append(body)
        self._fallback = fallback
        self._mode = mode
        self._next = 0
        self._lock = threading.Lock()
        self.uses: list[ToolUse] = []
        """Every call the fork made, in the order it was made."""
        self.unrecorded: str | None = None
        """Why the first call the recording could not answer was refused, if one was."""

    def call(
        self, tool: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], fn: Callable[..., Any]
    ) -> Any:
        ask = self._contract.tool(tool, args, kwargs)
        with self._lock:
            body = self._answer(ask.input_digest)
        if body is not None:
            return self._replayed(tool, ask.input, body)
        if self._fallback is None:
            message = (
                f"tool {tool} was called with arguments the parent run never used, and this "
                "fork answers tools from the parent's recording only; fork again with "
                "--tools live or --tools recorded-then-live to call it"
            )
            self._note(ToolUse(tool, ask.input, "unrecorded", error=f"ToolNotRecorded: {message}"))
            self.unrecorded = self.unrecorded or message
            raise ToolNotRecorded(message)
        try:
            result = self._fallback.call(tool, args, kwargs, fn)
        except Exception as exc:
            self._note(ToolUse(tool, ask.input, "live", error=_error_text(exc)))
            raise
        if inspect.isawaitable(result):  # an async tool of an async agent: noted when done
            return self._awaited(tool, ask.input, result)
        self._note(ToolUse(tool, ask.input, "live", self._contract.scrub.value(result, set())))
        return result

    async def _awaited(self, tool: str, arguments: Any, pending: Awaitable[Any]) -> Any:
        try:
            result = await pending
        except Exception as exc:
            self._note(ToolUse(tool, arguments, "live", error=_error_text(exc)))
            raise
        self._note(ToolUse(tool, arguments, "live", self._contract.scrub.value(result, set())))
        return result

    def _answer(self, input_digest: str) -> dict[str, Any] | None:
        if self._mode == "recorded":
            answers = self._answers.get(input_digest)
            if not answers:
                return None
            # Past the last recorded answer, the call keeps its last answer.
            return answers.pop(0) if len(answers) > 1 else answers[0]
        if self._mode == "live" or self._next >= len(self._recorded):
            return None
        recorded_digest, body = self._recorded[self._next]
        if recorded_digest != input_digest:
            self._next = len(self._recorded)  # past the first difference, all live
            return None
        self._next += 1
        return body

    def _replayed(self, tool: str, arguments: Any, body: Mapping[str, Any]) -> Any:
        error = body["error"]
        if error is not None:
            self._note(
                ToolUse(tool, arguments, "recorded", error=f"{error['type']}: {error['message']}")
            )
            raise rebuild_error({k: v for k, v in error.items() if v is not None})
        result = json.loads(body["result_json"])
        self._note(ToolUse(tool, arguments, "recorded", result))
        return _typed(result, body.get("result_codec"))

    def _note(self, use: ToolUse) -> None:
        with self._lock:
            self.uses.append(use)


@dataclass(frozen=True, slots=True)
class LlmUse:
    """One LLM call of a fork: the model it named, and what came back."""

    model: str
    response: Mapping[str, Any] | None
    """The provider's raw JSON (a recorded stream folds through ``completion_view``)."""
    error: str | None = None
    provider: str | None = None
    request: Mapping[str, Any] | None = None
    """The raw request the agent sent."""
    latency_ms: float | None = None
    """How long the model took to answer, timed around the send as the recorder times
    it (None when it was not timed)."""


RunT = TypeVar("RunT", Run, AsyncRun)


class _Observed(Generic[RunT]):
    """The fork's run as the agent's code sees it: every boundary is the recorder's,
    and the LLM calls are also noted for the comparison with the parent: those the
    code makes through ``run.llm`` and those a recording HTTP transport (a captured or
    instrumented SDK client) opens and settles (it is the run in force while the fork's
    entry runs, so a client that finds its run there notes its calls too). A subclass
    adds ``run.llm``, plain or awaited, over :meth:`_noting`."""

    def __init__(self, run: RunT, calls: list[LlmUse]) -> None:
        self._run: RunT = run
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        return getattr(self._run, name)

    def open_llm(
        self, request: Mapping[str, Any], *, provider: str, model: str | None = None
    ) -> _ObservedCrossing:
        """The run's ``open_llm`` (the call of a recording HTTP transport), noted when it
        is settled (an async run's settling is awaited)."""
        opened = self._run.open_llm(request, provider=provider, model=model)
        noted = LlmUse(_model_named(request, model), None, provider=provider, request=request)
        return _ObservedCrossing(opened, noted, self)

    def note(self, use: LlmUse) -> None:
        self._calls.append(use)

    @contextmanager
    def _noting(
        self, send: Callable[[Mapping[str, Any]], Any], request: Mapping[str, Any], **named: Any
    ) -> Iterator[tuple[_Stopwatch, Callable[[Mapping[str, Any]], Mapping[str, Any]]]]:
        """Notes the LLM call the block makes through the stopwatch it is given (``send``,
        timed): ``done(response)`` once it came back, or the exception it raised."""
        timed = _Stopwatch(send)
        provider, model = named["provider"], _model_named(request, named["model"])

        def use(response: Mapping[str, Any] | None, error: str | None = None) -> LlmUse:
            return LlmUse(model, response, error, provider, request, timed.ms)

        def done(response: Mapping[str, Any]) -> Mapping[str, Any]:
            self.note(use(response))
            return response

        try:
            yield timed, done
        except Exception as exc:
            self.note(use(None, _error_text(exc)))
            raise


class _Stopwatch:
    """``send``, timed as the recorder times an LLM call: from the call to the answer
    (an awaitable's, once awaited)."""

    def __init__(self, send: Callable[[Mapping[str, Any]], Any]) -> None:
        self._send = send
        self.ms: float | None = None

    def __call__(self, request: Mapping[str, Any]) -> Any:
        started = time.perf_counter()
        answer = self._send(request)
        if inspect.isawaitable(answer):
            return self._awaited(answer, started)
        self.ms = (time.perf_counter() - started) * 1000
        return answer

    async def _awaited(self, pending: Awaitable[Any], started: float) -> Any:
        try:
            return await pending
        finally:
            self.ms = (time.perf_counter() - started) * 1000


class _ObservedRun(_Observed[Run]):
    """The fork's :class:`Run`, observed (see :class:`_Observed`)."""

    def llm(
        self,
        send: Callable[[Mapping[str, Any]], Mapping[str, Any]],
        request: Mapping[str, Any],
        *,
        provider: str,
        model: str | None = None,
    ) -> Mapping[str, Any]:
        with self._noting(send, request, provider=provider, model=model) as (timed, done):
            return done(self._run.llm(timed, request, provider=provider, model=model))


class _ObservedAsyncRun(_Observed[AsyncRun]):
    """The fork's :class:`AsyncRun`, observed (see :class:`_Observed`)."""

    async def llm(
        self,
        send: Callable[[Mapping[str, Any]], Any],
        request: Mapping[str, Any],
        *,
        provider: str,
        model: str | None = None,
    ) -> Mapping[str, Any]:
        with self._noting(send, request, provider=provider, model=model) as (timed, done):
            return done(await self._run.llm(timed, request, provider=provider, model=model))


class _ObservedCrossing:
    """An LLM call a transport opened on the fork's run: noted as it is settled."""

    def __init__(self, opened: Any, use: LlmUse, run: _Observed[Any]) -> None:
        self._opened = opened
        self._use = use
        self._run = run

    def close(
        self, value: Any = None, *, error: BaseException | None = None, latency_ms: float
    ) -> Any:
        if not self._opened.closed:
            failed = None if error is None else _error_text(error)
            response = None if failed else value
            self._run.note(
                replace(self._use, response=response, error=failed, latency_ms=latency_ms)
            )
        return self._opened.close(value, error=error, latency_ms=latency_ms)


def _model_named(request: Mapping[str, Any], model: str | None) -> str:
    """The model an LLM call names: ``model``, else the request's."""
    return model or str(request.get("model", "unknown"))


def _error_text(exc: BaseException) -> str:
    # An HTTP error status a transport recorded carries the name it was recorded under
    # (RateLimitError), as the parent's recorded error does.
    recorded = getattr(exc, "recorded_error", None)
    if isinstance(recorded, Mapping) and isinstance(recorded.get("type"), str):
        return f"{recorded['type']}: {exc}"
    return f"{type(exc).__name__}: {exc}"


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
    tools: ToolMode = "recorded"
    tool_calls: Sequence[ToolUse] = ()
    llm_calls: Sequence[LlmUse] = ()
    unrecorded_tool: str | None = None
    """Set when the fork stopped at a tool call its parent never made (mode
    ``recorded``): the fork could not run as asked, whatever its status says."""
    duration_ms: float | None = None
    """How long the fork's run took, from its start to its end (its agent's work, and
    the recording of its first and last events)."""


def snapshot_of(body: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> RunSnapshot:
    """The input snapshot a ``run.started`` body records, changes included, with the
    run's ``tags`` (they travel on the envelope, not in the body)."""
    return RunSnapshot(
        code_version=body["code_version"],
        input=_typed(json.loads(body["input_json"]), body.get("input_codec")),
        prompt_templates={t["id"]: t["digest"] for t in body["prompt_templates"]},
        tool_schemas={t["name"]: t["version"] for t in body["tool_schemas"]},
        model_ids=tuple(body["model_ids"]),
        flags=dict(body["flags"]),
        permissions=tuple(body["permissions"]),
        parent_run_id=body["parent_run_id"],
        changes=dict(body["changes"]),
        tags=dict(tags or {}),
    )


def parent_snapshot(events: Sequence[Envelope], pipeline: PayloadPipeline) -> RunSnapshot:
    """The input snapshot recorded in a run's ``run.started``."""
    if not events or events[0].event_type != EventType.RUN_STARTED:
        raise ForkError("the parent run does not start with run.started; it cannot be forked")
    return snapshot_of(pipeline.unpack(events[0]), run_tags(events[0].attributes))


def forked_snapshot(
    parent: RunSnapshot, parent_run_id: str, changes: Mapping[str, str]
) -> RunSnapshot:
    """``parent`` with ``changes`` applied: ``model`` replaces the model ids, ``flag.X``
    sets flag X, ``tag.X`` sets tag X, ``code_version`` names the code that runs now;
    every change (these and any other, such as ``prompt``) is recorded for the agent and
    for the reader. A fork of a fork keeps its parent's changes, with these on top, so
    the agent sees what its parent saw and what changed since."""
    flags = dict(parent.flags)
    tags = dict(parent.tags)
    model_ids = parent.model_ids
    code_version = parent.code_version
    for key, value in changes.items():
        if key == "model":
            model_ids = (value,)
        elif key == "code_version":
            code_version = value
        elif key.startswith("flag."):
            flags[key.removeprefix("flag.")] = value
        elif key.startswith(TAG_PREFIX):
            tags[key.removeprefix(TAG_PREFIX)] = value
    return replace(
        parent,
        code_version=code_version,
        model_ids=model_ids,
        flags=flags,
        tags=tags,
        parent_run_id=parent_run_id,
        changes={**parent.changes, **changes},
    )


def fork_run(
    parent: Iterable[Envelope],
    factory: ForkFactory,
    *,
    changes: Mapping[str, str],
    base_url: str,
    api_key: str,
    tools: ToolMode = "recorded",
    effects: Literal["refuse", "sandbox"] = "refuse",
    engine: Engine | None = None,
    settings: Settings | None = None,
    pipeline: PayloadPipeline | None = None,
    keys: DataKeyStore | None = None,
    digests: DigestKeys | None = None,
) -> ForkResult:
    """Record a fork of ``parent``: into Postgres with ``engine`` (encrypted under its own
    data key with ``keys``), else in memory. ``pipeline`` opens the parent's bodies,
    ``digests`` gives its tenant's keyed digest when it was recorded with one.

    ``tools`` says how the fork's tool calls are answered (see :data:`ToolMode`);
    effects are refused, or confirmed by a sandbox that only writes them down, never
    sent. The result lists the fork's tool and LLM calls, for :func:`fork_diff`.

    Raises:
        ForkError: the parent cannot be forked (no ``run.started``), or ``tools`` is not
            one of :data:`TOOL_MODES`.
    """
    if tools not in TOOL_MODES:
        raise ForkError(f"tools {tools!r} is not one of {', '.join(TOOL_MODES)}")
    opener = pipeline or PayloadPipeline()
    events = list(parent)
    snapshot = forked_snapshot(parent_snapshot(events, opener), events[0].run_id, changes)
    live = None if tools == "recorded" else LiveTools()
    policy = RecordedTools(events, pipeline=opener, digests=digests, fallback=live, mode=tools)
    effect_policy: EffectPolicy = SandboxEffects() if effects == "sandbox" else RefuseEffects()
    config: RecorderConfig = {"settings": settings, "tools": policy, "effects": effect_policy}
    entry = factory(snapshot, base_url=base_url, api_key=api_key)
    fork = _Fork(entry, snapshot, events[0], [])
    if is_async_entry(entry):
        (run_id, status, output, error), recorded = _in_own_loop(
            fork.record_async(engine, keys, config)
        )
    else:
        (run_id, status, output, error), recorded = fork.record(engine, keys, config)
    sandboxed = effect_policy.sent if isinstance(effect_policy, SandboxEffects) else []
    return ForkResult(
        run_id,
        events[0].run_id,
        dict(changes),
        status,
        output,
        error,
        sandboxed,
        recorded,
        tools,
        list(policy.uses),
        fork.llm_calls,
        policy.unrecorded,
        fork.took_ms[0] if fork.took_ms else None,
    )


_Ended = tuple[str, str, Any, str | None]
"""How a fork's run ended: its id, status, output and error (``"Type: message"``)."""


@dataclass(frozen=True, slots=True)
class _Fork:
    """Drives the fork's agent as a new recorded run, plain or async, and ends that run
    whatever happens: ``succeeded``, ``failed`` with the agent's error, or ``failed`` on
    an interruption (which then goes on)."""

    entry: AgentEntry
    snapshot: RunSnapshot
    parent: Envelope
    llm_calls: list[LlmUse]
    took_ms: list[float] = field(default_factory=list)
    """How long the run took, once it ended."""

    def record(
        self, engine: Engine | None, keys: DataKeyStore | None, config: RecorderConfig
    ) -> tuple[_Ended, Sequence[Envelope]]:
        """Record a plain entry: into Postgres with ``engine``, else in memory (whose
        events come back)."""
        if engine is not None:
            sealed: RecorderConfig = {**config, "keys": keys}
            return self._driven(Recorder(engine, **sealed)), []
        memory = MemoryRecorder(**config)
        return self._driven(memory), memory.events

    async def record_async(
        self, engine: Engine | None, keys: DataKeyStore | None, config: RecorderConfig
    ) -> tuple[_Ended, Sequence[Envelope]]:
        """:meth:`record` for an ``async def`` entry, with an async recorder (on an
        async engine to ``engine``'s database, made and disposed in this loop)."""
        if engine is None:
            memory = AsyncMemoryRecorder(**config)
            return await self._driven_async(memory), memory.events
        writer = COMMAND_POOL.async_engine(engine.url)
        try:
            sealed: RecorderConfig = {**config, "keys": keys}
            return await self._driven_async(AsyncRecorder(writer, **sealed)), []
        finally:
            await writer.dispose()

    def _driven(self, recorder: Recorder | MemoryRecorder) -> _Ended:
        parent, snapshot = self.parent, self.snapshot
        started = time.perf_counter()
        run = recorder.start_run(snapshot, agent_id=parent.agent_id, tenant_id=parent.tenant_id)
        try:
            output = run.drive(self._observed, snapshot.input)
            self._took(started)
            return run.run_id, "succeeded", output, None
        except Exception as exc:  # drive() recorded it as the fork's failure, if it could
            _ended(run, exc)
            self._took(started)
            return run.run_id, "failed", None, _error_text(exc)
        except BaseException as exc:  # interrupted: the fork ends failed, and stops
            _ended(run, exc)
            raise

    def _took(self, started: float) -> None:
        self.took_ms.append((time.perf_counter() - started) * 1000)

    async def _driven_async(self, recorder: AsyncRecorder | AsyncMemoryRecorder) -> _Ended:
        parent, snapshot = self.parent, self.snapshot
        started = time.perf_counter()
        run = await recorder.start_run(
            snapshot, agent_id=parent.agent_id, tenant_id=parent.tenant_id
        )
        try:
            output = await run.drive(self._observed_async, snapshot.input)
            self._took(started)
            return run.run_id, "succeeded", output, None
        except Exception as exc:  # drive() recorded it as the fork's failure, if it could
            await _ended_async(run, exc)
            self._took(started)
            return run.run_id, "failed", None, _error_text(exc)
        except BaseException as exc:  # cancelled or interrupted: the fork ends failed
            await _ended_async(run, exc)
            raise

    def _observed(self, run: Run, given: Any) -> Any:
        watched = _ObservedRun(run, self.llm_calls)
        with in_force(watched):  # a client that finds its run in force finds this one
            return self.entry(watched, given)

    async def _observed_async(self, run: AsyncRun, given: Any) -> Any:
        watched = _ObservedAsyncRun(run, self.llm_calls)
        with in_force(watched):
            output = self.entry(watched, given)  # type: ignore[arg-type]
            return await output if inspect.isawaitable(output) else output


def _ended(run: Run, exc: BaseException) -> None:
    """End ``run`` failed with ``exc`` unless it ended already (``drive()`` ends it, unless
    writing the end failed)."""
    if not run.core.finished:
        run.finish(status="failed", error=exc)


async def _ended_async(run: AsyncRun, exc: BaseException) -> None:
    """:func:`_ended` for an async run."""
    if not run.core.finished:
        await run.finish(status="failed", error=exc)


REPLAY_BASE_URL = "http://replay.invalid/v1"
"""The endpoint a fork's factory is given in replay: a name that never resolves, since
replay calls nothing (the factory may build its client; the client is never used)."""


def fork_replay_entry(factory: ForkFactory, *, runs: AgentEntry | None = None) -> AgentEntry:
    """The entry point that replays forks as they were recorded.

    A fork's agent was built by ``factory`` from the fork's snapshot, its changes (a
    model, a prompt, a flag) included; in replay the same factory builds it again from
    the snapshot the fork's ``run.started`` recorded, so the code sees the same changes.
    It is given :data:`REPLAY_BASE_URL` and no key: replay calls no model. Runs that are
    not forks replay through ``runs``, or through ``factory`` from their own snapshot
    when ``runs`` is None.

    Register the result as the agent's replay entry (``BLACKBOX_AGENTS`` or ``--agent``
    naming a module attribute that holds it).
    """

    def entry(run: AgentRun, input: Any) -> Any:
        body = getattr(run, "snapshot_body", None)
        if body is None:
            raise ReplaySetupError(
                "fork_replay_entry replays recorded runs only: it was given a run that "
                "has no recorded snapshot (use the agent's own entry to record)"
            )
        snapshot = snapshot_of(body)
        if snapshot.parent_run_id is None and runs is not None:
            return runs(run, input)
        try:
            built = factory(snapshot, base_url=REPLAY_BASE_URL, api_key="replay-calls-no-model")
        except Exception as exc:
            raise ReplaySetupError(
                f"the fork factory could not build the agent of run {run.run_id}: "
                f"{_error_text(exc)}"
            ) from exc
        return built(run, input)

    return entry


def _typed(value: Any, codec: str | None) -> Any:
    """A value the parent recorded, with its type again."""
    return value if codec is None else recorded_value(value, codec)
