"""Opening recorded bodies from the console: one event's body, or a whole run's
conversation (every LLM and tool call of the run) for one stated purpose.

Both answer a POST only (a body is never in a URL), both go through the replayer's
audited opening (:func:`agent_blackbox.replayer.open_bodies`: one access audit request
row per body read, written before the topic is read), and both are read in worker
threads of their own, a few at a time, so a slow topic holds up these answers and never
the rest of the console.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from anyio import CapacityLimiter, to_thread
from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import Request
from starlette.responses import Response

from agent_blackbox.console._auth import Viewer
from agent_blackbox.console._conversation import Opened, conversation
from agent_blackbox.consumers import kept_values_txn
from agent_blackbox.keystore import PURPOSE_MAX_CHARS, purpose_problem
from agent_blackbox.replayer import (
    KeptValues,
    OpenedBody,
    SourceError,
    open_bodies,
    open_kept_values,
)
from agent_blackbox.schemas import BlackboxError

if TYPE_CHECKING:
    from agent_blackbox.console._app import _Pages

log = logging.getLogger(__name__)

BODY_READERS = 8
"""Openings read from the topic at once (each may wait on Kafka up to its limit)."""
CONVERSATION_BODIES = 200
"""The most bodies one opening of a run's conversation reads (its first calls)."""
CONVERSATION_EVENTS = frozenset({"llm.call", "tool.call"})
"""The events whose bodies a run's conversation shows."""
_PURPOSE_EXAMPLE = "for example 'incident 4411: refund loop'"


def audited_purpose(viewer: Viewer, purpose: str) -> str:
    """The purpose as the access audit keeps it: who, through the console, and why."""
    return f"console {viewer.name}: {purpose}"


def purpose_room(viewer: Viewer) -> int:
    """How long a purpose this viewer may state (the audit keeps it with their name)."""
    return PURPOSE_MAX_CHARS - len(audited_purpose(viewer, ""))


def purpose_refusal(viewer: Viewer, purpose: str) -> str | None:
    """Why ``purpose`` cannot open bodies (too short, too long, a control character),
    or None."""
    if len(audited_purpose(viewer, purpose)) > PURPOSE_MAX_CHARS:
        room = purpose_room(viewer)
        return f"the purpose is too long ({len(purpose)} characters, at most {room} here)"
    return purpose_problem(purpose, example=_PURPOSE_EXAMPLE)


def conversation_sequences(events: Any) -> list[int]:
    """The events of a run whose bodies its conversation shows, the first
    :data:`CONVERSATION_BODIES` of them."""
    found = [e.sequence for e in events if e.event_type in CONVERSATION_EVENTS]
    return found[:CONVERSATION_BODIES]


class Openings:
    """The two POST pages that open bodies, over the console's pages (which render and
    look up what the login may see)."""

    def __init__(self, pages: _Pages) -> None:
        self.pages = pages
        self.readers = CapacityLimiter(BODY_READERS)

    async def body(self, request: Request) -> Response:
        """One event's body (``/runs/{run_id}/events/{sequence}/body``)."""
        return await self._answer(request, self._open_body)

    async def conversation(self, request: Request) -> Response:
        """A run's conversation (``/runs/{run_id}/conversation``)."""
        return await self._answer(request, self._open_conversation)

    async def replay_values(self, request: Request) -> Response:
        """The values behind a replay's first divergence
        (``/runs/{run_id}/replays/{result_id}/values``)."""
        return await self._answer(request, self._open_replay_values)

    async def _answer(self, request: Request, opening: Any) -> Response:
        form = await request.form()
        refused = self.pages.form_refusal(request, form)
        if refused is not None:
            return self.pages.render(request, "error.html", status=403, message=refused)
        purpose = str(form.get("purpose", "")).strip()
        # When every reader is busy the viewer is told at once, rather than queued
        # behind a topic that may not answer.
        if self.readers.available_tokens < 1:
            return self.pages.render(
                request,
                "error.html",
                status=503,
                message=f"{BODY_READERS} bodies are being opened already (is Kafka slow?); "
                "try again in a moment",
            )
        answer: Response = await to_thread.run_sync(opening, request, purpose, limiter=self.readers)
        return answer

    def _open_body(self, request: Request, purpose: str) -> Response:
        # Looked up first: a run the login cannot see is refused before anything is
        # audited, and a reader is told it cannot open bodies without asking the keys.
        found = self.pages.event_of(request)
        if isinstance(found, Response):
            return found
        event, may_open = found
        viewer: Viewer = request.state.viewer
        problem = purpose_refusal(viewer, purpose)
        if problem is not None or not may_open:
            return self.pages.event_page(request, event, may_open, purpose=purpose, message=problem)
        run_id = request.path_params["run_id"]
        opened = self.read(request, run_id, [event.sequence], purpose)
        if isinstance(opened, BlackboxError):
            return self.pages.event_page(
                request,
                event,
                may_open,
                purpose=purpose,
                message=str(opened),
                status=_status(opened),
            )
        return self.pages.event_page(request, event, may_open, opened=opened[0], purpose=purpose)

    def _open_conversation(self, request: Request, purpose: str) -> Response:
        found = self.pages.run_of(request)
        if isinstance(found, Response):
            return found
        detail, may_open = found
        viewer: Viewer = request.state.viewer
        problem = purpose_refusal(viewer, purpose)
        wanted = conversation_sequences(detail.events)
        if problem is not None or not may_open or not wanted:
            return self.pages.run_page(request, detail, may_open, purpose=purpose, message=problem)
        opened = self.read(request, detail.run.run_id, wanted, purpose)
        if isinstance(opened, BlackboxError):
            return self.pages.run_page(
                request,
                detail,
                may_open,
                purpose=purpose,
                message=str(opened),
                status=_status(opened),
            )
        items = conversation(
            Opened(o.envelope.sequence, o.envelope.event_type, o.body, o.withheld) for o in opened
        )
        return self.pages.run_page(request, detail, may_open, purpose=purpose, items=items)

    def _open_replay_values(self, request: Request, purpose: str) -> Response:
        found = self.pages.run_of(request)
        if isinstance(found, Response):
            return found
        detail, may_open = found
        viewer: Viewer = request.state.viewer
        result_id = int(request.path_params["result_id"])
        if all(r.id != result_id for r in detail.replays):
            return self.pages.render(
                request, "error.html", status=404, message=f"no replay {result_id} of this run"
            )
        if not may_open:
            refused = "this console's login may not open recorded values (it is a reader)"
            return self.pages.run_page(request, detail, may_open, message=refused, status=403)
        problem = purpose_refusal(viewer, purpose)
        if problem is not None:
            return self.pages.run_page(request, detail, may_open, purpose=purpose, message=problem)
        c = self.pages.c
        try:
            with c.engine.connect() as conn:
                kept = kept_values_txn(conn, detail.run.run_id, result_id)
            if kept is None:
                raise BlackboxError(f"replay {result_id} of this run kept no values to open")
            values = open_kept_values(
                c.engine,
                KeptValues(kept.data, kept.key_id),
                run_id=kept.run_id,
                sequence=kept.sequence,
                tenant_id=kept.tenant_id,
                purpose=audited_purpose(viewer, purpose),
            )
        except (BlackboxError, SQLAlchemyError) as exc:
            log.warning("console: replay values of %s not opened: %s", detail.run.run_id, exc)
            message = str(exc) if isinstance(exc, BlackboxError) else "the views refused the read"
            return self.pages.run_page(
                request, detail, may_open, purpose=purpose, message=message, status=403
            )
        log.info("console: %s opened replay %s values of %s", viewer.name, result_id, kept.run_id)
        return self.pages.run_page(
            request, detail, may_open, purpose=purpose, replay_values=(result_id, values)
        )

    def read(
        self, request: Request, run_id: str, sequences: list[int], purpose: str
    ) -> list[OpenedBody] | BlackboxError:
        """The bodies, read through the audited path; or the error that stopped it."""
        viewer: Viewer = request.state.viewer
        c = self.pages.c
        try:
            opened = open_bodies(
                c.settings,
                c.engine,
                self.pages.index,
                run_id,
                sequences,
                purpose=audited_purpose(viewer, purpose),
            )
        except BlackboxError as exc:
            # Never the purpose or any content: the class of what stopped it.
            log.warning("console: bodies of %s not opened: %s", run_id, type(exc).__name__)
            return exc
        if len(sequences) == 1:
            log.info("console: %s opened the body of %s #%s", viewer.name, run_id, sequences[0])
        else:
            log.info("console: %s opened %d bodies of %s", viewer.name, len(sequences), run_id)
        return opened


def _status(exc: BlackboxError) -> int:
    return 503 if isinstance(exc, SourceError) else 403
