"""Every boundary of a run, written once for record and replay, sync and async.

Each boundary is a generator of steps, and the generator's return value is what the
boundary hands back to the agent's code. The steps say what the boundary needs, never
how a mode does it:

- :class:`Call`: a crossing around a call (the agent's function, or a read of the
  world: a clock, a random source); the driver sends back what the call returned, or
  throws in what it raised;
- :class:`Cross`: a crossing that calls nothing (an effect's intent, a state
  transition); the driver sends back its envelope and its output;
- :class:`Begin`: the place of a crossing that begins now (an effect's intent, whose
  default key is its start number);
- :class:`Settle`: a crossing whose call the agent's code already made (an open
  crossing: a recording transport's request, closed when its stream ends);
- :class:`End`: the end of the run.

Record mode's drivers (``_recording.py``) answer them by calling and appending; replay
mode's (the replayer's ``ReplayRun``) by taking the recorded event that answers each ask
and reading back what came of it. So the order of what happens at a boundary (check the
run, ask, call, record what came of it, also when it raised, hand back) cannot drift
between the modes or between sync and async code: there is one copy of it, and four thin
loops around it. This is the shape of a sans-IO core (Temporal's replayer reuses its live
worker the same way).

What each crossing records and how it is read back is in ``_crossings.py``: a step names
a builder and a reader, so building one costs a tuple and no closure (replay builds one
for every event it hands back).
"""

from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol, TypeVar

from agent_blackbox.outbox import _crossings as c
from agent_blackbox.outbox._asks import Ask, Contract, default_idempotency_key
from agent_blackbox.outbox._boundaries import Crossing
from agent_blackbox.outbox._crossings import Build, Done, Outcome, Read
from agent_blackbox.outbox._effects import EffectOutcome, EffectPolicy, EffectReceipt, ToolPolicy
from agent_blackbox.outbox._errors import EffectRejected, RunNotActive
from agent_blackbox.outbox._placement import Place
from agent_blackbox.outbox._recovery import PendingEffect
from agent_blackbox.schemas import EventType

__all__ = ["Begin", "Call", "Cross", "End", "Settle", "Steps"]

T = TypeVar("T")


class Call(tuple[Ask, Build, Read, Callable[..., Any], tuple[Any, ...], Place | None]):
    """``(ask, build, read, perform, arguments, place)``: cross the boundary ``ask`` asks
    for around a call of ``perform(*arguments)``; send back what it returned, or throw in
    what it raised. Record mode calls it (awaiting what it returns, in async code) and
    appends ``build``'s crossing of what came of it; replay mode calls nothing and reads
    what came of it from the recorded event with ``read``. ``place`` is where the
    crossing began (None: the driver places it as it begins).

    A plain tuple, not a named one: one is made for every crossing, and a named tuple's
    constructor (a Python function) cost 1.5% of a replayed event.
    """

    __slots__ = ()


class Cross(NamedTuple):
    """Cross the boundary ``ask`` asks for, calling nothing; send back its envelope and
    its output (the JSON its output digest is taken over: as built, or as recorded)."""

    ask: Ask
    build: Build
    place: Place | None = None
    connection: Any = None
    """Record mode appends in this caller's transaction (replay touches nothing)."""
    decided: Callable[[Contract, Ask], str] | None = None
    """The digest of the output the code decides (a transition's state): replay checks
    it against the recorded output digest."""


class Begin(NamedTuple):
    """Send back the place of a crossing of ``event_type`` that begins now, its start
    number as the run numbers it (replay: as the log does)."""

    event_type: EventType


class Settle(NamedTuple):
    """Record what came of a call the agent's code made itself (``done``), as the crossing
    ``outcome`` builds, begun at ``place``; send back its value, or throw in its error.
    Record mode only: in replay, the recording transport and the tool decorator ask
    ``llm`` and ``call``, which send nothing."""

    outcome: Outcome
    place: Place
    done: Done


class End(NamedTuple):
    """End the run (``run.finished``); send back its envelope."""

    status: str
    output: Any
    error: BaseException | None
    connection: Any = None


Step = Call | Cross | Begin | Settle | End
Steps = Generator[Step, Any, T]


class BoundaryCore(Protocol):
    """What a boundary needs of its run, whatever the mode: its id, the boundary contract
    of its redaction rules and digest, and the state its code set."""

    contract: Contract
    state: str | None
    state_digest: str | None

    @property
    def run_id(self) -> str: ...

    def check_active(self) -> None:
        """Raise when the run takes no more crossings."""
        ...


class Draws(Protocol):
    """A source of randomness (``random.Random``)."""

    def random(self) -> float: ...

    def randint(self, a: int, b: int) -> int: ...


# The boundaries -----------------------------------------------------------------------


def tool_call(
    core: BoundaryCore,
    tools: ToolPolicy,
    tool: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> Steps[Any]:
    """``tool.call``: the arguments are checked before ``fn`` runs."""
    core.check_active()
    ask = core.contract.tool(tool, args, kwargs)
    call = (tool, args, kwargs, fn)
    return (yield Call((ask, c.tool_call, c.tool_result, tools.call, call, None)))


def llm_call(
    core: BoundaryCore,
    send: Callable[[Mapping[str, Any]], Any],
    request: Mapping[str, Any],
    provider: str,
    model: str | None,
) -> Steps[Any]:
    """``llm.call``: the request is checked before it is sent."""
    core.check_active()
    ask = core.contract.llm(provider, model, request)
    return (yield Call((ask, c.llm, c.llm_response, send, (request,), None)))


def retrieve(
    core: BoundaryCore,
    search: Callable[..., Any],
    index: str,
    query: Any,
    index_version: str,
    filters: Mapping[str, Any] | None,
    top_k: int | None,
) -> Steps[Any]:
    """``retrieval``: the query is checked before the search runs; the hits come back as
    a list (what the search returned, listed)."""
    core.check_active()
    ask = core.contract.retrieval(index, index_version, query, filters, top_k)
    call = (search, query, filters, top_k)
    return (yield Call((ask, c.retrieval, c.retrieval_hits, _search, call, None)))


def _search(
    search: Callable[..., Any], query: Any, filters: Mapping[str, Any] | None, top_k: int | None
) -> Any:
    return _then(search(query, filters=filters, top_k=top_k), _listed)


def _listed(hits: Any) -> Any:
    listable = isinstance(hits, Iterable) and not isinstance(hits, Mapping | str | bytes)
    return list(hits) if listable else hits


def _then(found: Any, finish: Callable[[Any], Any]) -> Any:
    """``finish(found)``, or, when an async agent function handed back an awaitable, a
    coroutine that awaits it first (the async driver awaits what a call returns)."""
    return _finished_later(found, finish) if inspect.isawaitable(found) else finish(found)


async def _finished_later(found: Awaitable[Any], finish: Callable[[Any], Any]) -> Any:
    return finish(await found)


def now(core: BoundaryCore) -> Steps[datetime]:
    """The wall clock, UTC."""
    core.check_active()
    ask = core.contract.clock("wall")
    value_us = yield Call((ask, c.clock_read, c.clock_value, _wall_us, (), None))
    return datetime.fromtimestamp(value_us / 1e6, UTC)


def monotonic(core: BoundaryCore) -> Steps[float]:
    """A monotonic clock in seconds."""
    core.check_active()
    ask = core.contract.clock("monotonic")
    value_us = yield Call((ask, c.clock_read, c.clock_value, _monotonic_us, (), None))
    return float(value_us) / 1e6


def _wall_us() -> int:
    return time.time_ns() // 1000


def _monotonic_us() -> int:
    return time.monotonic_ns() // 1000


def random_float(core: BoundaryCore, source: Draws) -> Steps[float]:
    """A float in [0, 1)."""
    core.check_active()
    ask = core.contract.random("random")
    drawn: float = yield Call((ask, c.random_draw, c.drawn_float, source.random, (), None))
    return drawn


def random_int(core: BoundaryCore, source: Draws, low: int, high: int) -> Steps[int]:
    """An integer in [low, high]."""
    core.check_active()
    ask = core.contract.random("randint", {"low": low, "high": high})
    bounds = (low, high)
    drawn: int = yield Call((ask, c.random_draw, c.drawn_int, source.randint, bounds, None))
    return drawn


def random_uuid(core: BoundaryCore) -> Steps[uuid.UUID]:
    """A random UUID."""
    core.check_active()
    ask = core.contract.random("uuid4")
    drawn: uuid.UUID = yield Call((ask, c.uuid_draw, c.drawn_uuid, uuid.uuid4, (), None))
    return drawn


def effect(
    core: BoundaryCore,
    policy: EffectPolicy,
    name: str,
    perform: Callable[[str], Any],
    arguments: Mapping[str, Any],
    key: str | None,
) -> Steps[EffectReceipt]:
    """``effect.intent`` commits, then ``perform(key)``, then ``effect.receipt``.

    Without a key of the code's own, the intent's start number keys it: its sequence
    when effects run one at a time, and unique among concurrent ones (a replay reads it
    off the recorded intent)."""
    core.check_active()
    place: Place = yield Begin(EventType.EFFECT_INTENT)
    key = key or default_idempotency_key(core.run_id, place.started)
    contract = core.contract
    intent = contract.intent(name, key, arguments)
    yield Cross(intent, c.intent, place)  # committed before the external call, by design
    receipt = contract.receipt(name, key)
    call = (name, key, arguments, perform)
    value = yield Call((receipt, c.receipt, c.recorded_receipt, policy.perform, call, None))
    return c.receipt_of(name, key, value)


def resolve_effect(
    core: BoundaryCore,
    pending: PendingEffect,
    lookup: Callable[[str], Any],
) -> Steps[EffectReceipt]:
    """The receipt of an effect a crash left open, from what ``lookup`` finds out: a
    missing record is ``failed``, which the caller reads off the receipt."""
    if pending.run_id != core.run_id:
        raise RunNotActive(f"effect {pending.idempotency_key} belongs to run {pending.run_id}")
    name, key = pending.effect, pending.idempotency_key
    receipt = core.contract.receipt(name, key)
    try:
        value = yield Call((receipt, c.receipt, c.recorded_receipt, _look_up, (lookup, key), None))
    except EffectRejected as exc:
        return EffectReceipt(name, key, "failed", exc.external_id, None)
    return c.receipt_of(name, key, value)


def _look_up(lookup: Callable[[str], Any], key: str) -> Any:
    return _then(lookup(key), _confirmed)


def _confirmed(
    found: EffectOutcome | Mapping[str, Any] | None,
) -> EffectOutcome | Mapping[str, Any]:
    if found is None:
        raise EffectRejected("the external system has no record of this effect")
    return found


def transition(
    core: BoundaryCore, to_state: str, state: Any, reason: str | None, connection: Any
) -> Steps[Any]:
    """``state.transition`` (in the caller's transaction when ``connection`` is given);
    the state it sets is the output, checked by its digest in replay."""
    core.check_active()
    ask = core.contract.transition(core.state, to_state, state, reason)
    envelope, output = yield Cross(ask, c.transition, None, connection, c.state_digest)
    core.state = to_state
    core.state_digest = core.contract.digest.canonical.digest(output["state"])
    return envelope


def finish(
    core: BoundaryCore, status: str, output: Any, error: BaseException | None, connection: Any
) -> Steps[Any]:
    """``run.finished``; afterwards the run takes no more events."""
    core.check_active()
    return (yield End(status, output, error, connection))


# Crossings whose call the agent's code makes itself -----------------------------------


def settled(outcome: Outcome, place: Place, done: Done) -> Steps[Any]:
    """Record what came of a call begun at ``place``: its value, or what it raised
    (raised on once recorded)."""
    return (yield Settle(outcome, place, done))


def llm_opened(
    core: Any, request: Mapping[str, Any], provider: str, model: str | None
) -> tuple[Outcome, Place]:
    """The first half of ``llm.call`` for a request already on its way (a recording
    transport's): the call's place is taken now, and the request is checked (redacted,
    digested) when :func:`settled` records the call. Nothing then stands between the
    agent and the model's first chunk; a request that cannot be recorded (JSON with a
    NaN) is found after it was sent, as a recording failure."""
    core.check_active()
    place = core.placement.begin()
    contract: Contract = core.contract

    def outcome(response: Any, error: BaseException | None, latency_ms: float) -> Crossing:
        core.check_active()
        ask = contract.llm(provider, model, request)
        return c.llm(contract, ask, response, error, latency_ms)

    return outcome, place


def tool_opened(
    core: Any, tool: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> tuple[Outcome, Place]:
    """The first half of ``tool.call`` for a tool the agent's own code awaits (an async
    tool of a sync run): the arguments checked and the place taken; :func:`settled`
    records the result."""
    core.check_active()
    contract: Contract = core.contract
    ask = contract.tool(tool, args, kwargs)

    def outcome(result: Any, error: BaseException | None, latency_ms: float) -> Crossing:
        return c.tool_call(contract, ask, result, error, latency_ms)

    return outcome, core.placement.begin()
