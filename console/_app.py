"""The run console: a Starlette application over the views, with server-rendered pages
and no script at all.

Pages: the run list (filters, keyset pages), a run (its tree of spans, waterfall, LLM
calls, effects, replays, parent and forks, and its conversation after the viewer states
a purpose), an event (metadata; its body after the viewer states a purpose), and usage
charts. Bodies are opened through the audited replayer path (``_opening``). Every value from a
payload is escaped by the templates and its hidden characters (terminal escapes, bidi
controls) shown as visible escapes; a strict Content-Security-Policy forbids scripts,
frames and foreign resources; a body is only ever sent in answer to a POST, never in a
URL, and never logged.
"""

from __future__ import annotations

import hmac
import json
import logging
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from decimal import Decimal
from importlib import resources
from typing import Any
from urllib.parse import urlencode, urlsplit

from jinja2 import Environment
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from agent_blackbox.console._auth import (
    SESSION_COOKIE,
    SESSION_SECONDS,
    Authenticator,
    Refusal,
    StaticTokens,
    request_host,
    seconds,
)
from agent_blackbox.console._charts import charts, waterfall
from agent_blackbox.console._compare import compared
from agent_blackbox.console._conversation import Item
from agent_blackbox.console._experiments import experiment_routes
from agent_blackbox.console._fork_diff import fork_diff_routes
from agent_blackbox.console._opening import (
    CONVERSATION_EVENTS,
    Openings,
    conversation_sequences,
    purpose_room,
)
from agent_blackbox.console._templates import page_templates
from agent_blackbox.console._tree import failures, run_tree
from agent_blackbox.consumers import (
    USAGE_GROUPS,
    Cursor,
    RunDetail,
    RunEvent,
    RunFilter,
    SearchError,
    UsageRow,
    ViewRunIndex,
    fork_experiment_txn,
    list_runs_txn,
    llm_usage_txn,
    parse_search,
    prompt_versions_txn,
    run_detail_txn,
    run_events_txn,
    searchable_tenants_txn,
    session_txn,
    usage_series_txn,
    with_search,
)
from agent_blackbox.keystore import bodies_openable_txn
from agent_blackbox.replayer import OpenedBody
from agent_blackbox.schemas import (
    Settings,
    driver_cause,
    hidden_characters,
    is_run_id,
    moment,
)

log = logging.getLogger(__name__)

CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
"""No script from anywhere, styles only from the console's own stylesheet, no frames."""

_SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    # Same-origin (not no-referrer): a browser then sends the real Origin with the
    # console's own forms, which is how a form posted from another site is told apart.
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
    "cross-origin-opener-policy": "same-origin",
}
EVENTS_PAGE = 1_000
"""Rows of a run page's events table: a run of 20,000 events is twenty pages of it (its
tree lists every span on one)."""


@dataclass(frozen=True, slots=True)
class Console:
    """What the pages read through: the views' database, the topic, the viewer's port."""

    settings: Settings
    engine: Engine
    auth: Authenticator


def create_app(
    settings: Settings,
    engine: Engine,
    auth: Authenticator,
    *,
    allowed_hosts: Sequence[str] = (),
    secure_cookie: bool = False,
) -> Starlette:
    """The console as an ASGI application; with ``allowed_hosts``, it answers requests
    for those host names only (without authentication: ``localhost`` and loopback
    addresses only, whatever is given). ``secure_cookie``: the console is served over
    HTTPS by a proxy in front, so its session cookie is sent over HTTPS only."""
    console = Console(settings, engine, auth)
    pages = _Pages(console, page_templates(), secure_cookie=secure_cookie)
    openings = Openings(pages)
    # One stylesheet, read once: served from memory (the package may be installed as
    # links, which a static-files server rightly refuses to follow).
    stylesheet = (resources.files("agent_blackbox.console") / "static" / "console.css").read_bytes()

    def style(_request: Request) -> Response:
        return Response(stylesheet, media_type="text/css")

    return Starlette(
        routes=[
            Route("/", pages.home),
            Route("/login", pages.login, methods=["GET", "POST"]),
            Route("/logout", pages.logout, methods=["POST"]),
            Route("/runs", pages.runs),
            Route("/runs/{run_id}", pages.run),
            Route("/runs/{run_id}/events/{sequence:int}", pages.event),
            Route("/runs/{run_id}/events/{sequence:int}/body", openings.body, methods=["POST"]),
            Route("/runs/{run_id}/conversation", openings.conversation, methods=["POST"]),
            Route(
                "/runs/{run_id}/replays/{result_id:int}/values",
                openings.replay_values,
                methods=["POST"],
            ),
            *fork_diff_routes(pages, openings),
            Route("/sessions/{session_id:path}", pages.session),
            Route("/charts", pages.charts),
            Route("/prompts", lambda request: _prompts(pages, request)),
            *experiment_routes(pages.render, engine),
            Route("/static/console.css", style),
        ],
        middleware=[
            Middleware(
                _Guard,
                auth=auth,
                render=pages.render,
                hosts=frozenset(h.lower() for h in allowed_hosts),
            )
        ],
        exception_handlers={Exception: pages.failed, 404: pages.missing},
    )


class _Guard:
    """Every response gets the security headers; every page but sign-in and the
    stylesheet needs a viewer (a refusal is a page saying why, or the sign-in form)."""

    def __init__(
        self, app: ASGIApp, auth: Authenticator, render: Any, hosts: frozenset[str]
    ) -> None:
        self.app = app
        self.auth = auth
        self.render = render
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.decode("latin-1").lower() not in _SECURITY_HEADERS
                ]
                headers.extend((k.encode(), v.encode()) for k, v in _SECURITY_HEADERS.items())
                message = {**message, "headers": headers}
            await send(message)

        request = Request(scope)
        path = scope["path"]
        if self.hosts and request_host(request) not in self.hosts:
            names = ", ".join(sorted(self.hosts))
            page = self.render(
                request, "error.html", status=400, message=f"this console answers to {names} only"
            )
            await page(scope, receive, secured)
            return
        if path.startswith("/static/") or path == "/login":
            if path == "/login" and not isinstance(self.auth, StaticTokens):
                await RedirectResponse("/runs", 303)(scope, receive, secured)
                return
            await self.app(scope, receive, secured)
            return
        found = self.auth.authenticate(request)
        if isinstance(found, Refusal):
            if found.can_sign_in and request.method == "GET":
                wanted = path + (
                    f"?{scope['query_string'].decode('latin-1')}"
                    if scope.get("query_string")
                    else ""
                )
                target = "/login?" + urlencode({"next": wanted})
                await RedirectResponse(target, 303)(scope, receive, secured)
                return
            page = self.render(request, "error.html", status=found.status, message=found.reason)
            await page(scope, receive, secured)
            return
        scope.setdefault("state", {})["viewer"] = found
        await self.app(scope, receive, secured)


class _BadInput(ValueError):
    """A filter or form value the console cannot use; the message names it."""


class _Pages:
    def __init__(
        self, console: Console, templates: Environment, *, secure_cookie: bool = False
    ) -> None:
        self.c = console
        self.templates = templates
        self.index = ViewRunIndex(console.engine)
        self.secure_cookie = secure_cookie

    def render(
        self, request: Request, name: str, *, status: int = 200, **values: Any
    ) -> HTMLResponse:
        viewer = request.scope.get("state", {}).get("viewer")
        html = self.templates.get_template(name).render(
            viewer=viewer,
            signed_in=isinstance(self.c.auth, StaticTokens) and viewer is not None,
            csrf=self._csrf(request),
            **values,
        )
        return HTMLResponse(html, status_code=status)

    def missing(self, request: Request, exc: Exception) -> Response:
        """No such page: said on a page of the console's own."""
        response = self.render(request, "error.html", status=404, message="no such page")
        response.headers.update(_SECURITY_HEADERS)
        return response

    def failed(self, request: Request, exc: Exception) -> Response:
        """A page that failed: logged with its cause, answered without a traceback."""
        log.error("console: %s failed: %s: %s", request.url.path, type(exc).__name__, exc)
        response = self.render(
            request,
            "error.html",
            status=500,
            message="this page failed (the console logged why); try again, and see the "
            "console's log if it keeps failing",
        )
        response.headers.update(_SECURITY_HEADERS)  # answered past the guard
        return response

    def _csrf(self, request: Request) -> str:
        session = request.cookies.get(SESSION_COOKIE)
        if isinstance(self.c.auth, StaticTokens) and session:
            return self.c.auth.csrf_token(session)
        return ""

    def form_refusal(self, request: Request, form: Any) -> str | None:
        """Why a POST is refused: another site's form, or a missing session token."""
        if _cross_site(request):
            return "this form was posted from another site"
        viewer = request.scope.get("state", {}).get("viewer")
        session = viewer is not None and viewer.via == "session"
        if session and not hmac.compare_digest(str(form.get("csrf", "")), self._csrf(request)):
            return "this form is stale; reload the page and try again"
        return None

    # --- sign-in -------------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        assert isinstance(self.c.auth, StaticTokens)
        target = _local_path(request.query_params.get("next", "/runs"))
        if request.method == "GET":
            return self.render(request, "login.html", target=target, message=None)
        form = await request.form()
        if _cross_site(request):
            return self.render(request, "error.html", status=403, message="cross-site sign-in")
        client = request.client.host if request.client else "?"
        name = self.c.auth.sign_in(client, str(form.get("token", "")))
        if isinstance(name, int):
            log.warning("console sign-in throttled for %s (%d s)", client, name)
            return self.render(
                request,
                "login.html",
                status=429,
                target=target,
                message=f"too many failed sign-ins; wait {seconds(name)} and try again",
            )
        if name is None:
            log.warning("console sign-in refused from %s", client)
            return self.render(
                request, "login.html", status=401, target=target, message="that token is not known"
            )
        response = RedirectResponse(_local_path(str(form.get("next", target))), 303)
        response.set_cookie(
            SESSION_COOKIE,
            self.c.auth.session_cookie(name),
            max_age=SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=self.secure_cookie or request.url.scheme == "https",
        )
        log.info("console: %s signed in", name)
        return response

    async def logout(self, request: Request) -> Response:
        form = await request.form()
        if self.form_refusal(request, form) is not None:
            return self.render(request, "error.html", status=403, message="cross-site sign-out")
        session = request.cookies.get(SESSION_COOKIE)
        if isinstance(self.c.auth, StaticTokens) and session:
            self.c.auth.end_session(session)
        response = RedirectResponse("/login" if isinstance(self.c.auth, StaticTokens) else "/", 303)
        response.delete_cookie(
            SESSION_COOKIE, httponly=True, samesite="strict", secure=self.secure_cookie
        )
        return response

    # --- pages ---------------------------------------------------------------------

    def home(self, request: Request) -> Response:
        return RedirectResponse("/runs", 303)

    def runs(self, request: Request) -> Response:
        query = request.query_params
        kept = {k: v for k, v in query.items() if v and k not in ("after_at", "after_id")}
        try:
            where = _searched(_run_filter(query), query.get("q") or "")
            after = _cursor(query.get("after_at"), query.get("after_id"))
            limit = _int(query.get("limit"), "limit", default=50)
        except _BadInput as exc:
            return self.render(
                request, "runs.html", status=400, page=None, query=kept, more=None, message=str(exc)
            )
        with _Reading() as failed, self.c.engine.connect() as conn:
            page = list_runs_txn(conn, where, after=after, limit=limit)
            searched = searchable_tenants_txn(conn) if where.text else None
        if failed.message:
            return self.render(request, "error.html", status=503, message=failed.message)
        more = None
        if page.next is not None:
            more = urlencode(
                {**kept, "after_at": page.next.started_at.isoformat(), "after_id": page.next.run_id}
            )
        return self.render(
            request, "runs.html", page=page, query=kept, more=more, message=None, searched=searched
        )

    def session(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        if not 0 < len(session_id) <= 200 or hidden_characters().search(session_id):
            return self.render(request, "error.html", status=404, message="no such session")
        with _Reading() as failed, self.c.engine.connect() as conn:
            detail = session_txn(conn, session_id)
        if failed.message:
            return self.render(request, "error.html", status=503, message=failed.message)
        if detail is None:
            return self.render(
                request,
                "error.html",
                status=404,
                message=f"no run of session {session_id} in the views this console's login can see",
            )
        listed = urlencode({"session": session_id})
        return self.render(request, "session.html", s=detail, listed=listed)

    def run(self, request: Request) -> Response:
        found = self.run_of(request)
        if isinstance(found, Response):
            return found
        return self.run_page(request, *found)

    def run_of(self, request: Request) -> tuple[RunDetail, bool] | Response:
        """The run the path names, as the login sees it, and whether the login may open
        bodies; or the page saying why there is none."""
        run_id = request.path_params["run_id"]
        with _Reading() as failed, self.c.engine.connect() as conn:
            detail = run_detail_txn(conn, run_id) if is_run_id(run_id) else None
            may_open = detail is not None and bodies_openable_txn(conn)
            if detail is not None and detail.run.parent_run_id:
                detail = replace(detail, experiment=fork_experiment_txn(conn, run_id))
        if failed.message:
            return self.render(request, "error.html", status=503, message=failed.message)
        if detail is None:
            return self.render(
                request,
                "error.html",
                status=404,
                message=f"no run {run_id} in the views this console's login can see",
            )
        return detail, may_open

    def run_page(
        self,
        request: Request,
        detail: RunDetail,
        may_open: bool,
        *,
        purpose: str = "",
        message: str | None = None,
        items: list[Item] | None = None,
        status: int = 400,
        replay_values: tuple[int, dict[str, Any]] | None = None,
    ) -> Response:
        """A run's page; with ``items``, its conversation opened for ``purpose``. Its
        events table lists a page of :data:`EVENTS_PAGE` events from ``?events_from=``."""
        try:
            first = _int(request.query_params.get("events_from"), "events_from", default=1)
        except _BadInput as exc:
            return self.render(request, "error.html", status=400, message=str(exc))
        listed, earlier, later = _events_page(detail.events, first)
        llm = [e for e in listed if e.event_type == "llm.call"]
        tree = run_tree(detail.events, name=detail.run.agent_id)
        return self.render(
            request,
            "run.html",
            d=detail,
            listed=listed,
            earlier=earlier,
            later=later,
            tree=tree,
            fall=waterfall(tree),
            llm=llm,
            failures=failures(tree),
            bodies=len(conversation_sequences(detail.events)),
            calls=sum(e.event_type in CONVERSATION_EVENTS for e in detail.events),
            items=items,
            may_open=may_open,
            purpose=purpose,
            message=message,
            room=purpose_room(request.state.viewer),
            replay_values=replay_values,
            status=200 if message is None else status,
        )

    def event(self, request: Request) -> Response:
        found = self.event_of(request)
        if isinstance(found, Response):
            return found
        return self.event_page(request, *found)

    def event_of(self, request: Request) -> tuple[RunEvent, bool] | Response:
        """The event the path names, as the login sees it, and whether the login may
        open bodies; or the page saying why there is none."""
        run_id = request.path_params["run_id"]
        sequence = request.path_params["sequence"]
        if not is_run_id(run_id):
            return self.render(
                request, "error.html", status=404, message="no such run in these views"
            )
        with _Reading() as failed, self.c.engine.connect() as conn:
            found = run_events_txn(conn, run_id, first=sequence, limit=1)
            may_open = bodies_openable_txn(conn)
        if failed.message:
            return self.render(request, "error.html", status=503, message=failed.message)
        if not found or found[0].sequence != sequence:
            return self.render(
                request, "error.html", status=404, message=f"no event {sequence} of run {run_id}"
            )
        return found[0], may_open

    def event_page(
        self,
        request: Request,
        event: RunEvent,
        may_open: bool,
        *,
        opened: OpenedBody | None = None,
        purpose: str = "",
        message: str | None = None,
        status: int = 400,
    ) -> Response:
        """An event's page; with ``opened``, its body opened for ``purpose``."""
        body = None
        if opened is not None and opened.body is not None:
            body = json.dumps(opened.body, indent=2, ensure_ascii=False, default=str)
        return self.render(
            request,
            "event.html",
            run_id=request.path_params["run_id"],
            e=event,
            opened=opened,
            body=body,
            purpose=purpose,
            message=message,
            may_open=may_open,
            room=purpose_room(request.state.viewer),
            status=200 if message is None else status,
        )

    def charts(self, request: Request) -> Response:
        query = request.query_params
        by = query.get("by", "model")
        bucket = query.get("bucket", "minute")
        try:
            since = _moment(query.get("since") or "6h", "since")
            if by not in USAGE_GROUPS:
                raise _BadInput(f"split by one of {', '.join(USAGE_GROUPS)}, not {by!r}")
            if bucket not in ("minute", "hour"):
                raise _BadInput(f"bucket is minute or hour, not {bucket!r}")
        except _BadInput as exc:
            return self.render(request, "error.html", status=400, message=str(exc))
        with _Reading() as failed, self.c.engine.connect() as conn:
            points = usage_series_txn(conn, since=since, bucket=bucket, by=by)
            summary = llm_usage_txn(conn, by=by, since=since)
        if failed.message:
            return self.render(request, "error.html", status=503, message=failed.message)
        return self.render(
            request,
            "charts.html",
            charts=charts(points, bucket=bucket),
            summary=summary,
            total_cost=_total_cost(summary),
            unpriced=sum(u.unpriced_calls for u in summary),
            by=by,
            bucket=bucket,
            since=query.get("since") or "6h",
            groups=list(USAGE_GROUPS),
        )


def _prompts(pages: _Pages, request: Request) -> Response:
    """Prompt versions side by side (``/prompts?agent=...&since=...``)."""
    agent = request.query_params.get("agent") or None
    try:
        since = _moment(request.query_params.get("since") or "7d", "since")
    except _BadInput as exc:
        return pages.render(request, "error.html", status=400, message=str(exc))
    with _Reading() as failed, pages.c.engine.connect() as conn:
        rows = prompt_versions_txn(conn, since=since, agent=agent)
    if failed.message:
        return pages.render(request, "error.html", status=503, message=failed.message)
    return pages.render(
        request,
        "prompts.html",
        versions=compared(rows),
        agent=agent or "",
        since=request.query_params.get("since") or "7d",
    )


class _Reading:
    """A database read whose failure becomes a message on the page, not a traceback."""

    def __init__(self) -> None:
        self.message: str | None = None

    def __enter__(self) -> _Reading:
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        if isinstance(exc, SQLAlchemyError):
            detail = driver_cause(exc)
            log.warning("console: the views could not be read: %s", detail)
            self.message = (
                f"the views could not be read ({detail}); is the database up and does this "
                "console's login have the blackbox_reader role?"
            )
            return True
        return False


def _events_page(
    events: Sequence[RunEvent], first: int
) -> tuple[Sequence[RunEvent], int | None, int | None]:
    """The page of :data:`EVENTS_PAGE` of ``events`` (in sequence order) from sequence
    ``first``, and where the pages before and after it start (None: there is none)."""
    at = bisect_left(events, first, key=lambda e: e.sequence)
    earlier = events[max(at - EVENTS_PAGE, 0)].sequence if at else None
    later = events[at + EVENTS_PAGE].sequence if at + EVENTS_PAGE < len(events) else None
    return events[at : at + EVENTS_PAGE], earlier, later


def _searched(where: RunFilter, search: str) -> RunFilter:
    """``where`` narrowed by the search box's query."""
    if not search.strip():
        return where
    try:
        return with_search(where, parse_search(search))  # type: ignore[no-any-return]
    except SearchError as exc:
        raise _BadInput(f"search: {exc}") from None


def _run_filter(query: Any) -> RunFilter:
    values: dict[str, Any] = {}
    for f in fields(RunFilter):
        raw = (query.get(f.name) or "").strip()
        if not raw or f.name == "tags":  # tags come from the search box only
            continue
        if f.name == "since":
            values["since"] = _moment(raw, "since")
        elif f.name == "until":
            values["until"] = _moment(raw, "until")
        elif f.name == "has_error":
            values["has_error"] = raw in ("1", "on", "true", "yes")
        elif f.name == "latency_above_ms":
            values["latency_above_ms"] = _float(raw, "latency above")
        else:
            if len(raw) > 200:
                raise _BadInput(f"{f.name} is longer than 200 characters")
            if hidden_characters().search(raw):
                raise _BadInput(f"{f.name} holds a control or invisible character")
            values[f.name] = raw
    return RunFilter(**values)


def _moment(raw: str, name: str, *, spans: str = "mhd") -> datetime:
    """``15m``, ``6h``, ``7d`` ago (given ``spans``), or an ISO 8601 moment (UTC when it
    names no zone)."""
    try:
        return moment(raw, spans=spans, naive=UTC)
    except ValueError as exc:
        if "year 1" in str(exc):
            raise _BadInput(f"{name}: {exc}") from None
        span = " or a span like 6h" if spans else ""
        raise _BadInput(f"{name}: give a time like 2026-12-01T10:00{span}") from None


def _float(raw: str, name: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise _BadInput(f"{name}: {raw!r} is not a number") from None
    if not 0 <= value < 1e12:
        raise _BadInput(f"{name}: give a number of milliseconds from 0")
    return value


def _int(raw: str | None, name: str, *, default: int) -> int:
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 6:
        raise _BadInput(f"{name}: {raw!r} is not a whole number")
    return int(raw)


def _cursor(at: str | None, run_id: str | None) -> Cursor | None:
    if not at or not run_id:
        return None
    if len(run_id) > 200 or hidden_characters().search(run_id):
        raise _BadInput("after_id is not a run id")
    return Cursor(_moment(at, "after_at", spans=""), run_id)


def _cross_site(request: Request) -> bool:
    """Whether a POST came from another site's page: by the browser's fetch metadata
    when it sends it, and by the Origin header (``null`` included) when present."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return True
    origin = request.headers.get("origin")
    return origin is not None and urlsplit(origin).netloc != request.headers.get("host")


def _local_path(target: str) -> str:
    """``target`` when it is a path of this console, else the run list (no open redirect)."""
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/runs"


def _total_cost(rows: Sequence[UsageRow]) -> Decimal | None:
    """The exact sum of the groups' costs; None when none of them is priced."""
    costs = [row.cost_usd for row in rows if row.cost_usd is not None]
    return sum(costs, Decimal(0)) if costs else None
