"""The run console: a Starlette application over the views, with server-rendered pages
and no script at all.

Pages: the run list (filters, keyset pages), a run (waterfall, LLM calls, effects,
replays, parent and forks), an event (metadata; its body after the viewer states a
purpose, through the audited replayer path), and usage charts. Every value from a
payload is escaped by the templates and its hidden characters (terminal escapes, bidi
controls) shown as visible escapes; a strict Content-Security-Policy forbids scripts,
frames and foreign resources; a body is only ever sent in answer to a POST, never in a
URL, and never logged.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from decimal import Decimal
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from anyio import CapacityLimiter, to_thread
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape
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
    Viewer,
    request_host,
)
from agent_blackbox.console._charts import CHART_HEIGHT, CHART_WIDTH, charts, waterfall
from agent_blackbox.console._experiments import experiment_routes
from agent_blackbox.consumers import (
    USAGE_GROUPS,
    Cursor,
    RunEvent,
    RunFilter,
    UsageRow,
    ViewRunIndex,
    dollars_text,
    list_runs_txn,
    llm_usage_txn,
    run_detail_txn,
    run_events_txn,
    usage_series_txn,
)
from agent_blackbox.keystore import PURPOSE_MAX_CHARS, bodies_openable_txn, purpose_problem
from agent_blackbox.replayer import SourceError, open_body
from agent_blackbox.schemas import (
    BlackboxError,
    Settings,
    hidden_characters,
    moment,
    visible_text,
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
_RUN_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
BODY_READERS = 8
"""Bodies read from the topic at once (each may wait on Kafka up to its limit)."""
_PURPOSE_EXAMPLE = "for example 'incident 4411: refund loop'"


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
    templates = Environment(
        loader=FileSystemLoader(str(resources.files("agent_blackbox.console") / "templates")),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    templates.filters["shown"] = visible_text
    templates.filters["shown_json"] = _shown_json
    templates.filters["run_path"] = _run_path
    templates.filters["attributes_line"] = _attributes_line
    templates.filters["when"] = _when
    templates.filters["ms"] = _ms
    templates.filters["dollars"] = _dollars
    templates.globals.update(chart_width=CHART_WIDTH, chart_height=CHART_HEIGHT)
    pages = _Pages(console, templates, secure_cookie=secure_cookie)
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
            Route("/runs/{run_id}/events/{sequence:int}/body", pages.body, methods=["POST"]),
            Route("/charts", pages.charts),
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
        self.body_readers = CapacityLimiter(BODY_READERS)

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

    def _form_allowed(self, request: Request, form: Any) -> str | None:
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
        name = self.c.auth.check_token(str(form.get("token", "")))
        if name is None:
            if self.c.auth.throttled(client):
                log.warning("console sign-in throttled for %s", client)
                return self.render(
                    request,
                    "login.html",
                    status=429,
                    target=target,
                    message="too many failed sign-ins from here; wait a minute and try again",
                )
            self.c.auth.failed_sign_in(client)
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
        if self._form_allowed(request, form) is not None:
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
            where = _run_filter(query)
            after = _cursor(query.get("after_at"), query.get("after_id"))
            limit = _int(query.get("limit"), "limit", default=50)
        except _BadInput as exc:
            return self.render(
                request, "runs.html", status=400, page=None, query=kept, more=None, message=str(exc)
            )
        with _Reading() as failed, self.c.engine.connect() as conn:
            page = list_runs_txn(conn, where, after=after, limit=limit)
        if failed.message:
            return self.render(request, "error.html", status=503, message=failed.message)
        more = None
        if page.next is not None:
            more = urlencode(
                {**kept, "after_at": page.next.started_at.isoformat(), "after_id": page.next.run_id}
            )
        return self.render(request, "runs.html", page=page, query=kept, more=more, message=None)

    def run(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        with _Reading() as failed, self.c.engine.connect() as conn:
            detail = run_detail_txn(conn, run_id) if _RUN_ID.fullmatch(run_id) else None
        if failed.message:
            return self.render(request, "error.html", status=503, message=failed.message)
        if detail is None:
            return self.render(
                request,
                "error.html",
                status=404,
                message=f"no run {run_id} in the views this console's login can see",
            )
        llm = [e for e in detail.events if e.event_type == "llm.call"]
        return self.render(request, "run.html", d=detail, fall=waterfall(detail.events), llm=llm)

    def event(self, request: Request) -> Response:
        found = self._event(request)
        if isinstance(found, Response):
            return found
        return self._event_page(request, *found, opened=None, purpose="", message=None)

    async def body(self, request: Request) -> Response:
        form = await request.form()
        refused = self._form_allowed(request, form)
        if refused is not None:
            return self.render(request, "error.html", status=403, message=refused)
        purpose = str(form.get("purpose", "")).strip()
        # Bodies are read in worker threads of their own, a few at a time: a slow topic
        # holds up these answers, never the rest of the console (its pages use the
        # default threads). When all are busy the viewer is told at once.
        if self.body_readers.available_tokens < 1:
            return self.render(
                request,
                "error.html",
                status=503,
                message=f"{BODY_READERS} bodies are being opened already (is Kafka slow?); "
                "try again in a moment",
            )
        return await to_thread.run_sync(self._open, request, purpose, limiter=self.body_readers)

    def _open(self, request: Request, purpose: str) -> Response:
        # Looked up first: a run the login cannot see is refused before anything is
        # audited, and a reader is told it cannot open bodies without asking the keys.
        found = self._event(request)
        if isinstance(found, Response):
            return found
        event, may_open = found
        viewer: Viewer = request.state.viewer
        audited = _audited_purpose(viewer, purpose)
        if len(audited) > PURPOSE_MAX_CHARS:
            room = PURPOSE_MAX_CHARS - len(_audited_purpose(viewer, ""))
            problem: str | None = (
                f"the purpose is too long ({len(purpose)} characters, at most {room} here)"
            )
        else:
            problem = purpose_problem(purpose, example=_PURPOSE_EXAMPLE)
        if problem is not None or not may_open:
            return self._event_page(
                request, event, may_open, opened=None, purpose=purpose, message=problem
            )
        run_id, sequence = request.path_params["run_id"], event.sequence
        try:
            opened = open_body(
                self.c.settings, self.c.engine, self.index, run_id, sequence, purpose=audited
            )
        except BlackboxError as exc:
            log.warning(
                "console: body of %s #%s not opened: %s", run_id, sequence, type(exc).__name__
            )
            status = 503 if isinstance(exc, SourceError) else 403
            return self._event_page(
                request,
                event,
                may_open,
                opened=None,
                purpose=purpose,
                message=str(exc),
                status=status,
            )
        log.info("console: %s opened the body of %s #%s", viewer.name, run_id, sequence)
        return self._event_page(
            request, event, may_open, opened=opened, purpose=purpose, message=None
        )

    def _event(self, request: Request) -> tuple[RunEvent, bool] | Response:
        """The event the path names, as the login sees it, and whether the login may
        open bodies; or the page saying why there is none."""
        run_id = request.path_params["run_id"]
        sequence = request.path_params["sequence"]
        if _RUN_ID.fullmatch(run_id) is None:
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

    def _event_page(
        self,
        request: Request,
        event: RunEvent,
        may_open: bool,
        *,
        opened: Any,
        purpose: str,
        message: str | None,
        status: int = 400,
    ) -> Response:
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
            room=PURPOSE_MAX_CHARS - len(_audited_purpose(request.state.viewer, "")),
            status=200 if message is None else status,
        )

    def charts(self, request: Request) -> Response:
        query = request.query_params
        by = query.get("by", "model")
        bucket = query.get("bucket", "minute")
        try:
            since = _since(query.get("since") or "6h")
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


class _Reading:
    """A database read whose failure becomes a message on the page, not a traceback."""

    def __init__(self) -> None:
        self.message: str | None = None

    def __enter__(self) -> _Reading:
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        if isinstance(exc, SQLAlchemyError):
            detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            log.warning("console: the views could not be read: %s", detail)
            self.message = (
                f"the views could not be read ({detail}); is the database up and does this "
                "console's login have the blackbox_reader role?"
            )
            return True
        return False


def _run_filter(query: Any) -> RunFilter:
    values: dict[str, Any] = {}
    for f in fields(RunFilter):
        raw = (query.get(f.name) or "").strip()
        if not raw:
            continue
        if f.name == "since":
            values["since"] = _since(raw)
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


def _since(raw: str) -> datetime:
    """``15m``, ``6h``, ``7d`` ago, or an ISO 8601 moment (UTC when it names no zone)."""
    try:
        return moment(raw, spans="mhd", naive=UTC)
    except ValueError as exc:
        if "year 1" in str(exc):
            raise _BadInput(f"since: {exc}") from None
        raise _BadInput("since: give a time like 2026-12-01T10:00 or a span like 6h") from None


def _moment(raw: str, name: str) -> datetime:
    """An ISO 8601 moment (UTC when it names no zone)."""
    try:
        return moment(raw, spans="", naive=UTC)
    except ValueError:
        raise _BadInput(f"{name}: give a time like 2026-12-01T10:00 or a span like 6h") from None


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
    return Cursor(_moment(at, "after_at"), run_id)


def _audited_purpose(viewer: Viewer, purpose: str) -> str:
    """The purpose as the access audit keeps it: who, through the console, and why."""
    return f"console {viewer.name}: {purpose}"


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


def _when(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _shown_json(pretty: str) -> str:
    """Pretty-printed JSON with its hidden characters made visible line by line: the
    line breaks are the layout's own (JSON strings never hold a raw one)."""
    return "\n".join(visible_text(line) for line in pretty.split("\n"))


def _run_path(run_id: str) -> Markup:
    """``/runs/<run id>``, quoted and escaped once for every link of a run page."""
    return escape(f"/runs/{quote(run_id, safe='')}")


def _attributes_line(attributes: dict[str, str]) -> str:
    """An event's attributes on one line (``k=v``, each value cut to 80 characters and an
    ellipsis), hidden characters made visible: one string a row, however many."""
    return "  ".join(
        f"{visible_text(k)}={visible_text(v if len(v) <= 80 else v[:79] + '…')}"
        for k, v in sorted(attributes.items())
    )


def _total_cost(rows: Sequence[UsageRow]) -> Decimal | None:
    """The exact sum of the groups' costs; None when none of them is priced."""
    costs = [row.cost_usd for row in rows if row.cost_usd is not None]
    return sum(costs, Decimal(0)) if costs else None


def _dollars(value: Decimal | None, unpriced: int = 0) -> str:
    """A cost as people read money, with the calls it leaves out: ``$0.0123``,
    ``$0.0123 + 2 unpriced``, ``2 unpriced``; empty when there is nothing to say."""
    shown = "" if value is None else dollars_text(value)
    if not unpriced:
        return shown
    return f"{shown} + {unpriced} unpriced" if shown else f"{unpriced} unpriced"


def _ms(value: float | None) -> str:
    """A latency as people read it: ``0.42 ms``, ``12.3 ms``, ``840 ms``, ``2.41 s``."""
    if value is None:
        return ""
    if value < 1:
        return f"{value:.2f} ms"
    if value < 100:
        return f"{value:.1f} ms"
    return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.2f} s"
