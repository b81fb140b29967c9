"""The recorder's front: who a run belongs to (RunOptions), the errors of misuse, the
async API as the sync one, method for method, and the boundaries written once per
flavour: both modes' runs inherit them, and the async ones are the sync ones awaited."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import os
import textwrap
from typing import Any

import pytest

from agent_blackbox.keystore import DataKeyStore, KeystoreError, LocalKeyProvider
from agent_blackbox.outbox import (
    AgentRun,
    AsyncMemoryRecorder,
    AsyncRecorder,
    AsyncRun,
    MemoryRecorder,
    Recorder,
    Run,
    RunNotActive,
    RunOptions,
    RunSnapshot,
)
from agent_blackbox.outbox.contract import AsyncBoundaries, Boundaries
from agent_blackbox.replayer import AsyncReplayRun, ReplayRun

SNAPSHOT = RunSnapshot(code_version="api/1", input={"n": 1})


def test_keywords_beside_options_replace_their_fields() -> None:
    recorder = MemoryRecorder()
    options = RunOptions(agent_id="a", tenant_id="t1", subject_ids=("s-1",))
    run = recorder.start_run(SNAPSHOT, options, tenant_id="t2")
    [started] = recorder.events
    assert (started.agent_id, started.tenant_id, started.subject_ids) == ("a", "t2", ("s-1",))
    assert run.core.identity.tenant_id == "t2"


def test_keywords_alone_still_describe_a_run() -> None:
    recorder = MemoryRecorder()
    run, output = recorder.record(
        lambda r, i: r.call("double", lambda n: 2 * n, i["n"]),
        SNAPSHOT,
        agent_id="a",
        subject_ids=["s-1"],  # type: ignore[arg-type]  # a list is taken as a tuple
    )
    assert output == 2
    assert {e.subject_ids for e in recorder.events} == {("s-1",)}
    assert run.last_sequence == 3


def test_a_run_without_an_agent_is_refused_before_anything_is_recorded() -> None:
    recorder = MemoryRecorder()
    with pytest.raises(TypeError, match="agent_id"):
        recorder.start_run(SNAPSHOT)
    with pytest.raises(ValueError, match="agent_id must be a non-empty string"):
        recorder.start_run(SNAPSHOT, agent_id="")
    with pytest.raises(ValueError, match="subject_ids is a tuple"):
        RunOptions(agent_id="a", subject_ids="customer-1")  # type: ignore[arg-type]
    assert recorder.events == []


def test_a_memory_recorder_refuses_a_run_id_it_has_and_keys_it_cannot_keep() -> None:
    recorder = MemoryRecorder()
    recorder.start_run(SNAPSHOT, agent_id="a", run_id="r-1")
    with pytest.raises(RunNotActive, match="r-1 exists already"):
        recorder.start_run(SNAPSHOT, agent_id="a", run_id="r-1")
    assert len(recorder.events) == 1
    keys = DataKeyStore(LocalKeyProvider({"v1": os.urandom(32)}))
    with pytest.raises(KeystoreError, match="keeps no data keys"):
        MemoryRecorder(keys=keys)


@pytest.mark.parametrize(
    ("name", "where"),
    [
        ("Relay", "agent_blackbox.outbox.relay"),
        ("ensure_topic", "agent_blackbox.broker"),
        ("capture_openai", "agent_blackbox.outbox.integrations.openai"),
        ("ReplayRun", "agent_blackbox.replayer"),
    ],
)
def test_a_name_that_moved_out_of_the_agents_package_says_where_it_is(
    name: str, where: str
) -> None:
    with pytest.raises(ImportError, match=where):
        exec(f"from agent_blackbox.outbox import {name}")


# The async API is the sync API, awaited ---------------------------------------------

SYNC_ONLY = {
    # A block that joins every event to one transaction: the async code passes
    # ``connection=`` to ``transition`` and ``finish`` instead.
    (Run, AsyncRun): {"joined"},
    # What the replay driver reports on (its sync twin, ``AsyncReplayRun.replay``, is the
    # same replay); the driver reads it there.
    (ReplayRun, AsyncReplayRun): {
        "joined",
        "drives_here",
        "divergences",
        "consumed",
        "stall_timeout",
        "recorded_status",
        "recorded_error",
        "setup_error",
        "limitations",
    },
}


# Plain in both: they do no I/O (an open crossing's ``close`` is what is awaited), or are
# called from an audit hook, which cannot await.
PLAIN_IN_BOTH = {"open_llm", "open_tool", "unrecorded"}


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


@pytest.mark.parametrize(
    ("sync", "asynchronous"),
    [
        (Recorder, AsyncRecorder),
        (MemoryRecorder, AsyncMemoryRecorder),
        (Run, AsyncRun),
        (ReplayRun, AsyncReplayRun),
    ],
    ids=lambda cls: cls.__name__,
)
def test_the_async_twin_has_every_method_of_the_sync_one(sync: type, asynchronous: type) -> None:
    """Method for method: a method the sync class has and its async twin lacks, or has
    as a plain function, or with other parameters, fails here."""
    missing = _public(sync) - _public(asynchronous)
    assert missing == SYNC_ONLY.get((sync, asynchronous), set())
    for name in sorted(_public(sync) & _public(asynchronous)):
        plain = inspect.getattr_static(sync, name)
        twin = inspect.getattr_static(asynchronous, name)
        if plain is twin or not inspect.isfunction(plain):
            continue  # shared by both (a common base), a property or a class method
        if name in PLAIN_IN_BOTH:
            assert not inspect.iscoroutinefunction(twin), f"{name} is plain in both"
            continue
        assert inspect.iscoroutinefunction(twin), f"{asynchronous.__name__}.{name} is not async"
        assert list(inspect.signature(twin).parameters) == list(
            inspect.signature(plain).parameters
        ), f"{asynchronous.__name__}.{name} takes other parameters than {sync.__name__}.{name}"
    if hasattr(sync, "from_settings"):
        assert isinstance(inspect.getattr_static(asynchronous, "from_settings"), classmethod)


# The boundaries are written once per flavour, and both modes inherit them -------------

SURFACE = sorted(name for name in vars(Boundaries) if not name.startswith("_"))

RECORD_ONLY = {
    # Crossings whose call the agent's code makes itself (a recording transport's request,
    # a tool awaited in a sync run): in replay the transport and the tool decorator ask
    # ``llm`` and ``call``, which answer from the log without sending anything.
    "open_llm",
    "open_tool",
    # Recovery after a crash is an operator's act on a resumed writer, not agent code.
    "resolve_effect",
    # The recorder drives the entry; the replayer's driver (``replay_run``) drives it there.
    "drive",
}
REPLAY_ONLY = {
    "input",
    "drives_here",
    "divergences",
    "consumed",
    "stall_timeout",
    "recorded_status",
    "recorded_error",
    "setup_error",
    "limitations",
}
"""What only a replay has: the recorded input it drives the code with, and its report."""


def _shape(function: Any) -> tuple[list[tuple[str, Any, Any]], str | None, str]:
    """A function's parameters (name, kind, default), docstring and body, its body with
    every ``await`` taken out and without annotations: what a sync twin generated from
    the async code would be."""

    class Unawaited(ast.NodeTransformer):
        def visit_Await(self, node: ast.Await) -> ast.AST:
            return self.visit(node.value)

        def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
            assert node.value is not None
            return ast.Assign(targets=[node.target], value=self.visit(node.value), lineno=0)

    tree = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    assert isinstance(tree, ast.FunctionDef | ast.AsyncFunctionDef)
    body = [Unawaited().visit(statement) for statement in tree.body[1:]]  # after the docstring
    parameters = [
        (p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()
    ]
    return parameters, inspect.getdoc(function), "\n".join(ast.dump(node) for node in body)


@pytest.mark.parametrize("name", SURFACE)
def test_the_async_surface_is_the_sync_one_awaited(name: str) -> None:
    """Name for name, parameter for parameter, docstring and body, but for ``await``:
    the check psycopg's generated sync code gets, on a surface written twice by hand."""
    sync, asynchronous = vars(Boundaries)[name], vars(AsyncBoundaries)[name]
    assert inspect.iscoroutinefunction(asynchronous)
    assert _shape(asynchronous) == _shape(sync)


def test_the_two_surfaces_have_the_same_boundaries() -> None:
    assert sorted(n for n in vars(AsyncBoundaries) if not n.startswith("_")) == SURFACE


@pytest.mark.parametrize(
    ("run", "surface"),
    [
        (Run, Boundaries),
        (ReplayRun, Boundaries),
        (AsyncRun, AsyncBoundaries),
        (AsyncReplayRun, AsyncBoundaries),
    ],
    ids=lambda cls: cls.__name__,
)
def test_every_run_crosses_its_boundaries_through_the_surface(run: type, surface: type) -> None:
    """No run class writes a boundary of its own: record and replay, sync and async, go
    through the same methods, and so through the same step generators."""
    for name in SURFACE:
        assert inspect.getattr_static(run, name) is vars(surface)[name], f"{run.__name__}.{name}"


def test_what_only_one_mode_has_is_listed_with_its_reason() -> None:
    """A public name of one mode's runs that the other mode's lack fails here, unless it
    is listed above with why."""
    record = _public(Run) | _public(AsyncRun)
    replay = _public(ReplayRun) | _public(AsyncReplayRun)
    assert record - replay == RECORD_ONLY
    assert replay - record == REPLAY_ONLY
    for recording, replaying in ((Run, ReplayRun), (AsyncRun, AsyncReplayRun)):
        for name in sorted(_public(recording) & _public(replaying)):
            plain, twin = (inspect.getattr_static(c, name) for c in (recording, replaying))
            if not inspect.isfunction(plain):
                continue  # a property, or a class attribute (``replaying``)
            assert inspect.iscoroutinefunction(twin) == inspect.iscoroutinefunction(plain)
            assert list(inspect.signature(twin).parameters) == list(
                inspect.signature(plain).parameters
            ), f"{replaying.__name__}.{name} takes other parameters than {recording.__name__}'s"


def test_the_agent_protocol_is_the_surface_but_the_end() -> None:
    """What agent code programs against (``AgentRun``) is the surface's boundaries with
    the same parameters; ending the run is the driver's."""
    protocol = {name for name in vars(AgentRun) if not name.startswith("_")} - {"run_id"}
    assert protocol == set(SURFACE) - {"finish"}
    for name in protocol:
        declared = inspect.signature(vars(AgentRun)[name]).parameters.values()
        written = inspect.signature(vars(Boundaries)[name]).parameters.values()
        assert [(p.name, p.kind, p.default) for p in declared] == [
            (p.name, p.kind, p.default) for p in written
        ], name


def test_the_async_recorders_record_resume_and_resolve_like_the_sync_ones() -> None:
    """The recovery path, end to end in memory: a crash between intent and receipt, the
    open effect found, the run resumed, the receipt resolved, the same envelopes."""

    class Crash(BaseException):
        pass

    def die(key: str) -> Any:
        raise Crash

    def sync_part(recorder: MemoryRecorder) -> list[tuple[str, str]]:
        run = recorder.start_run(SNAPSHOT, agent_id="twins")
        with contextlib.suppress(Crash):
            run.effect("notify", die, arguments={"to": "x"}, key="k-1")
        (pending,) = recorder.unresolved_effects(run_id=run.run_id)
        resumed = recorder.resume(run.run_id)
        receipt = resumed.resolve_effect(pending, lambda key: {"external_id": f"ext-{key}"})
        assert receipt.status == "confirmed"
        assert recorder.unresolved_effects(run_id=run.run_id) == []
        resumed.finish(output=receipt.external_id)
        _, output = recorder.record(lambda run, input: input["n"], SNAPSHOT, agent_id="twins")
        assert output == 1
        return [(e.event_type, e.input_digest) for e in recorder.events]

    async def async_part(recorder: AsyncMemoryRecorder) -> list[tuple[str, str]]:
        run = await recorder.start_run(SNAPSHOT, agent_id="twins")
        with contextlib.suppress(Crash):
            await run.effect("notify", die, arguments={"to": "x"}, key="k-1")
        (pending,) = await recorder.unresolved_effects(run_id=run.run_id)
        resumed = await recorder.resume(run.run_id)

        async def lookup(key: str) -> dict[str, str]:
            return {"external_id": f"ext-{key}"}

        receipt = await resumed.resolve_effect(pending, lookup)
        assert receipt.status == "confirmed"
        assert await recorder.unresolved_effects(run_id=run.run_id) == []
        await resumed.finish(output=receipt.external_id)

        async def entry(run: Any, input: Any) -> Any:
            return input["n"]

        _, output = await recorder.record(entry, SNAPSHOT, agent_id="twins")
        assert output == 1
        return [(e.event_type, e.input_digest) for e in recorder.events]

    assert asyncio.run(async_part(AsyncMemoryRecorder())) == sync_part(MemoryRecorder())
