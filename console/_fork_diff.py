"""A fork (or a re-execution) beside the run it was forked from: both conversations,
their tool calls with arguments and results, and their final outputs, side by side, the
calls that differ marked.

The page (``/runs/{fork}/diff``) asks for one stated purpose and opens both runs'
LLM and tool call bodies through the audited path of :mod:`._opening` (one access
audit row per body read, as a run's conversation does). The two runs' calls are lined
up by :func:`align`: the longest matching order of call kinds (an LLM call of a model,
a call of a tool), so a fork that made one more tool call shows a gap on the parent's
side, not every later call shifted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import TYPE_CHECKING, Any

from anyio import to_thread
from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent_blackbox.console._conversation import (
    Exchange,
    Item,
    Opened,
    ToolRun,
    Turn,
    conversation,
)
from agent_blackbox.console._opening import (
    Openings,
    conversation_sequences,
    purpose_refusal,
    purpose_room,
)
from agent_blackbox.consumers import RunDetail, fork_experiment_txn, run_detail_txn
from agent_blackbox.schemas import BlackboxError

if TYPE_CHECKING:
    from agent_blackbox.console._app import _Pages


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the diff: the parent's item and the fork's (either may be None: a
    call only one side made), and whether they differ."""

    parent: Item | None
    fork: Item | None
    differs: bool


def _key(item: Item) -> str:
    """What two calls must share to be lined up: their kind and model or tool."""
    if isinstance(item, Exchange):
        return f"llm:{item.model}"
    if isinstance(item, ToolRun):
        return f"tool:{item.tool}"
    return f"withheld:{item.event_type}"


def _content(item: Item) -> tuple[Any, ...]:
    """What two lined-up calls are compared on: what was sent and what came back
    (never the sequence or latency, which differ between any two runs)."""
    if isinstance(item, Exchange):
        return (item.model, item.turns, item.answer, item.error)
    if isinstance(item, ToolRun):
        return (item.tool, item.arguments, item.result, item.error)
    return (item.event_type, item.reason)


def align(parent: Sequence[Item], fork: Sequence[Item]) -> list[Row]:
    """The two runs' calls lined up in order: calls of the same kind and model or tool
    face each other where the longest common order allows, the rest stand alone.

    Args:
        parent: the parent run's conversation items, in sequence order.
        fork: the fork's, in sequence order.
    """
    matcher = SequenceMatcher(None, [_key(i) for i in parent], [_key(i) for i in fork])
    rows: list[Row] = []
    for tag, p0, p1, f0, f1 in matcher.get_opcodes():
        left, right = list(parent[p0:p1]), list(fork[f0:f1])
        if tag in ("equal", "replace"):
            # A replaced block pairs what it can in order, then leaves the rest alone.
            for a, b in zip(left, right, strict=False):
                rows.append(Row(a, b, _content(a) != _content(b) or _key(a) != _key(b)))
            left, right = left[len(right) :], right[len(left) :]
        rows.extend(Row(a, None, True) for a in left)
        rows.extend(Row(None, b, True) for b in right)
    return rows


def final_output(items: Sequence[Item]) -> tuple[Turn, ...]:
    """A run's final output: the answer of its last LLM call (empty when it made none)."""
    for item in reversed(items):
        if isinstance(item, Exchange):
            return item.answer
    return ()


def fork_diff_routes(pages: _Pages, openings: Openings) -> list[Route]:
    """The fork diff page's routes: GET asks for a purpose, POST opens both sides."""
    page = _ForkDiff(pages, openings)
    return [
        Route("/runs/{run_id}/diff", page.ask),
        Route("/runs/{run_id}/diff", page.opened, methods=["POST"]),
    ]


class _ForkDiff:
    def __init__(self, pages: _Pages, openings: Openings) -> None:
        self.pages = pages
        self.openings = openings

    def ask(self, request: Request) -> Response:
        found = self._pair(request)
        if isinstance(found, Response):
            return found
        return self._page(request, *found)

    async def opened(self, request: Request) -> Response:
        form = await request.form()
        refused = self.pages.form_refusal(request, form)
        if refused is not None:
            return self.pages.render(request, "error.html", status=403, message=refused)
        purpose = str(form.get("purpose", "")).strip()
        answer: Response = await to_thread.run_sync(
            self._open, request, purpose, limiter=self.openings.readers
        )
        return answer

    def _open(self, request: Request, purpose: str) -> Response:
        found = self._pair(request)
        if isinstance(found, Response):
            return found
        fork, parent, may_open, experiment = found
        problem = purpose_refusal(request.state.viewer, purpose)
        if problem is not None or not may_open:
            return self._page(request, fork, parent, may_open, experiment, purpose, problem)
        sides: list[list[Item]] = []
        for detail in (parent, fork):
            wanted = conversation_sequences(detail.events)
            read = self.openings.read(request, detail.run.run_id, wanted, purpose) if wanted else []
            if isinstance(read, BlackboxError):
                return self._page(request, fork, parent, may_open, experiment, purpose, str(read))
            sides.append(
                conversation(
                    Opened(o.envelope.sequence, o.envelope.event_type, o.body, o.withheld)
                    for o in read
                )
            )
        rows = align(sides[0], sides[1])
        outputs = (final_output(sides[0]), final_output(sides[1]))
        return self._page(
            request, fork, parent, may_open, experiment, purpose, None, rows=rows, outputs=outputs
        )

    def _pair(
        self, request: Request
    ) -> tuple[RunDetail, RunDetail, bool, tuple[str, str, str] | None] | Response:
        """The fork the path names, its parent, whether bodies may be opened, and the
        experiment that made the fork; or the page saying why there is no pair."""
        found = self.pages.run_of(request)
        if isinstance(found, Response):
            return found
        fork, may_open = found
        parent_id = fork.run.parent_run_id
        if not parent_id:
            return self.pages.render(
                request,
                "error.html",
                status=404,
                message=f"run {fork.run.run_id} is not a fork: it has no parent run to compare",
            )
        try:
            with self.pages.c.engine.connect() as conn:
                parent = run_detail_txn(conn, parent_id)
                experiment = fork_experiment_txn(conn, fork.run.run_id)
        except SQLAlchemyError:
            return self.pages.render(
                request, "error.html", status=503, message="the views cannot be read; try again"
            )
        if parent is None:
            return self.pages.render(
                request,
                "error.html",
                status=404,
                message=f"the parent run {parent_id} is not in the views this login can see",
            )
        return fork, parent, may_open, experiment

    def _page(
        self,
        request: Request,
        fork: RunDetail,
        parent: RunDetail,
        may_open: bool,
        experiment: tuple[str, str, str] | None,
        purpose: str = "",
        message: str | None = None,
        *,
        rows: list[Row] | None = None,
        outputs: tuple[tuple[Turn, ...], tuple[Turn, ...]] = ((), ()),
    ) -> Response:
        return self.pages.render(
            request,
            "diff.html",
            fork=fork,
            parent=parent,
            may_open=may_open,
            experiment=experiment,
            purpose=purpose,
            message=message,
            rows=rows,
            outputs=outputs,
            outputs_differ=outputs[0] != outputs[1],
            differing=0 if rows is None else sum(r.differs for r in rows),
            room=purpose_room(request.state.viewer),
            status=200 if message is None else 400,
        )
