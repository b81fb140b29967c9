"""A run as a tree of spans, from the views alone (no body is read).

Each event is a span from its start (its time less its latency, for a call) to its end,
named for what it crossed: the model of an LLM call, the tool, the effect, the
retrieval index, the clock, the state entered. The recorder writes where each crossing
ran among the run's concurrent work as attributes (``branch``, ``parent_branch``,
``started``: see ``agent_blackbox.outbox._placement``): every branch of concurrent work
but the run's own is a span of its own, holding its events, nested under the branch that
spawned it, and placed among its siblings by when its first crossing started. An
effect's receipt is nested under its intent, so the intent's span lasts until the
receipt came. Errors are named by what failed: an LLM call, a tool (which the agent may
have caught and carried on from), a retrieval, an effect or the run itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from agent_blackbox.consumers import RunEvent

KINDS = {
    "llm.call": "LLM",
    "tool.call": "tool",
    "retrieval": "retrieval",
    "effect.intent": "effect",
    "effect.receipt": "receipt",
    "clock.read": "clock",
    "random.draw": "random",
    "state.transition": "state",
    "run.started": "run",
    "run.finished": "run",
}
"""What each event type is called as a span's kind."""

_FAILED_RECEIPTS = frozenset({"failed", "unknown"})


@dataclass(slots=True)
class Span:
    """One span of the tree: an event (``sequence`` set), a branch of concurrent work,
    or the run (the root)."""

    name: str
    kind: str
    start: datetime
    end: datetime
    sequence: int | None = None
    branch: int = 0
    detail: str = ""
    error: str | None = None
    children: list[Span] = field(default_factory=list)
    order: int = 0
    """Where it goes among its siblings: the start number of its first crossing."""
    timed: bool = True
    """Whether it lasts (a call, a branch, an effect until its receipt), rather than
    being a moment (a clock read, a state entered)."""

    @property
    def duration_ms(self) -> float:
        return max((self.end - self.start).total_seconds() * 1000, 0.0)

    def walk(self, depth: int = 0) -> list[tuple[int, Span]]:
        """This span and those under it, depth first, each with its depth (in one pass
        with a stack of its own: a run's tree may be 20,000 spans)."""
        found: list[tuple[int, Span]] = []
        pending = [(depth, self)]
        while pending:
            level, span = pending.pop()
            found.append((level, span))
            pending.extend((level + 1, child) for child in reversed(span.children))
        return found

    @property
    def errors(self) -> list[str]:
        """The errors of this span and every span under it, in order."""
        return [s.error for _, s in self.walk() if s.error]


@dataclass(frozen=True, slots=True)
class TreeRow:
    """One span as the page lists it, flat: it opens a list of its own when it has
    children; after a leaf, ``closes`` lists end (those of the spans it was the last of)."""

    span: Span
    depth: int
    closes: int


def tree_rows(tree: Span) -> list[TreeRow]:
    """The spans of ``tree`` depth first, ready to be written as nested lists without
    recursion in the template (a run of 20,000 events is 20,000 rows)."""
    walked = tree.walk()
    rows = []
    for index, (depth, span) in enumerate(walked):
        following = walked[index + 1][0] if index + 1 < len(walked) else 0
        rows.append(TreeRow(span, depth, 0 if span.children else depth - following))
    return rows


def run_tree(events: Sequence[RunEvent], *, name: str) -> Span:
    """The tree of a run's ``events`` (in sequence order), its root named ``name``."""
    spans = [_event_span(e) for e in events]
    nested = _pair_receipts(spans, events)
    start = min((s.start for s in spans), default=datetime.min)
    root = Span(name, "run", start, max((s.end for s in spans), default=start))
    branches: dict[int, Span] = {}
    parents: dict[int, int] = {}
    for index, (span, event) in enumerate(zip(spans, events, strict=True)):
        if index in nested:
            continue
        if event.branch == 0:
            root.children.append(span)
            continue
        if event.branch not in branches:
            branches[event.branch] = Span(
                f"branch {event.branch}", "branch", span.start, span.end, branch=event.branch
            )
            parents[event.branch] = _parent_branch(event)
        branches[event.branch].children.append(span)
    for number, branch in branches.items():
        # A branch is spawned by one numbered before it: anything else is not believed.
        parent = parents[number]
        holder = branches.get(parent, root) if parent < number else root
        holder.children.append(branch)
    for number in sorted(branches, reverse=True):  # the branches a branch spawned first
        _fit(branches[number])
    for _, span in root.walk():
        span.children.sort(key=lambda s: (s.order, s.sequence or 0))
    finished = [e for e in events if e.event_type == "run.finished"]
    root.detail = finished[-1].attributes.get("status", "") if finished else "running"
    return root


def _fit(span: Span) -> None:
    """A branch's extent and place: from its first start to its last end."""
    span.start = min(c.start for c in span.children)
    span.end = max(c.end for c in span.children)
    span.order = min(c.order for c in span.children)
    span.detail = ", ".join(dict.fromkeys(c.name for c in span.children))


def _parent_branch(event: RunEvent) -> int:
    raw = event.attributes.get("parent_branch", "0")
    return int(raw) if raw.isdigit() else 0


def _event_span(event: RunEvent) -> Span:
    a = event.attributes
    start = event.recorded_at
    if event.latency_ms is not None and event.latency_ms > 0:
        start = event.recorded_at - timedelta(milliseconds=event.latency_ms)
    raw = a.get("started", "")
    return Span(
        name=span_name(event),
        kind=KINDS.get(event.event_type, event.event_type),
        start=start,
        end=event.recorded_at,
        sequence=event.sequence,
        branch=event.branch,
        order=int(raw) if raw.isdigit() else event.sequence,
        detail=_detail(event),
        error=span_error(event),
        timed=event.latency_ms is not None,
    )


def span_name(event: RunEvent) -> str:
    """What an event crossed, as its span is named (the event type only as a last resort)."""
    a, kind = event.attributes, event.event_type
    named = {
        "llm.call": a.get("model") or "LLM call",
        "tool.call": a.get("tool"),
        "retrieval": a.get("index"),
        "effect.intent": a.get("effect"),
        "effect.receipt": a.get("effect"),
        "clock.read": f"clock ({a['clock']})" if a.get("clock") else "clock",
        "random.draw": f"random ({a['kind']})" if a.get("kind") else "random",
        "state.transition": f"state → {a['to_state']}" if a.get("to_state") else None,
        "run.started": "run started",
        "run.finished": "run finished",
    }.get(kind)
    return named or kind


def span_error(event: RunEvent) -> str | None:
    """What failed at ``event``, named by what it was: a caught tool error is a tool
    error, never a failed LLM call."""
    a, kind = event.attributes, event.event_type
    error = a.get("error")
    if kind == "llm.call" and error:
        return f"LLM error: {error}"
    if kind == "tool.call" and error:
        return f"tool error: {error}"
    if kind == "retrieval" and error:
        return f"retrieval error: {error}"
    if kind == "effect.receipt" and a.get("status") in _FAILED_RECEIPTS:
        return f"effect {a['status']}"
    if kind == "run.finished" and (error or a.get("status") == "failed"):
        return f"run failed: {error}" if error else "run failed"
    return None


def _detail(event: RunEvent) -> str:
    a, kind = event.attributes, event.event_type
    if kind == "llm.call":
        tokens = a.get("total_tokens")
        words = [a.get("provider", ""), a.get("finish_reason", "")]
        words.append(f"{tokens} tokens" if tokens else "")
        return " · ".join(w for w in words if w)
    if kind == "effect.receipt":
        return a.get("status", "")
    if kind == "run.finished":
        return a.get("status", "")
    if kind == "retrieval":
        return f"{a['hits']} hits" if a.get("hits") else ""
    return ""


def _pair_receipts(spans: list[Span], events: Sequence[RunEvent]) -> set[int]:
    """Nest each effect receipt under its intent (by idempotency key, else the oldest
    open intent of the same effect), which then lasts until the receipt came; the
    indexes of the receipts nested."""
    open_intents: list[tuple[RunEvent, Span]] = []
    nested = set()
    for index, (span, event) in enumerate(zip(spans, events, strict=True)):
        if event.event_type == "effect.intent":
            open_intents.append((event, span))
        elif event.event_type == "effect.receipt":
            found = _intent_of(event, open_intents)
            if found is not None:
                open_intents.remove(found)
                intent = found[1]
                intent.children.append(span)
                intent.end = max(intent.end, span.end)
                intent.timed = True
                intent.detail = span.detail
                nested.add(index)
    return nested


def _intent_of(
    receipt: RunEvent, intents: list[tuple[RunEvent, Span]]
) -> tuple[RunEvent, Span] | None:
    key = receipt.attributes.get("idempotency_key")
    if key is not None:
        return next((i for i in intents if i[0].attributes.get("idempotency_key") == key), None)
    effect = receipt.attributes.get("effect")
    return next((i for i in intents if i[0].attributes.get("effect") == effect), None)


def failures(tree: Span) -> dict[str, int]:
    """How many spans of ``tree`` failed, by what failed (``tool error``, ``LLM
    error``, ...), in the order first met."""
    counts: dict[str, int] = {}
    for error in tree.errors:
        kind = error.split(":", 1)[0]
        counts[kind] = counts.get(kind, 0) + 1
    return counts
