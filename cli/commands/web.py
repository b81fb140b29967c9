"""``blackbox web``: serve the run console."""

from __future__ import annotations

import errno
import socket
import sys
from pathlib import Path

import click
import uvicorn
from sqlalchemy import text
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from agent_blackbox.cli._wiring import wired
from agent_blackbox.console import (
    Authenticator,
    ConsoleAuthError,
    LoopbackOnly,
    StaticTokens,
    TrustedProxyHeader,
    add_token,
    create_app,
    is_loopback,
)
from agent_blackbox.schemas import driver_cause, safe_console, safe_text
from agent_blackbox.wiring import SERVICE_POOL


@click.command("web")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--token-file",
    envvar="BLACKBOX_CONSOLE_TOKEN_FILE",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Owner-only file of `name token` lines: viewers sign in with a token.",
)
@click.option(
    "--new-token",
    "new_token_for",
    metavar="NAME",
    help="Give NAME a newly generated token in --token-file (created owner-only when "
    "missing; NAME's old token is replaced), print it once, and exit without serving.",
)
@click.option(
    "--proxy-header",
    default=None,
    help="Believe the user a reverse proxy names in this header (e.g. X-Forwarded-User).",
)
@click.option(
    "--trusted-proxy",
    multiple=True,
    help="The proxy's address or network (repeatable); needed with --proxy-header.",
)
@click.option(
    "--secure-cookie",
    is_flag=True,
    help="The console is served over HTTPS by a proxy in front: the session cookie is "
    "then sent over HTTPS only.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    help="Answer requests for this host name only (repeatable), e.g. the name the viewers "
    "use; needed with --proxy-header. Without a token or a proxy it is refused: the "
    "console then answers to localhost and loopback addresses only.",
)
def web_command(
    host: str,
    port: int,
    token_file: Path | None,
    new_token_for: str | None,
    proxy_header: str | None,
    trusted_proxy: tuple[str, ...],
    secure_cookie: bool,
    allowed_hosts: tuple[str, ...],
) -> None:
    """Serve the run console (runs, waterfalls, bodies on a stated purpose, charts).

    Without --token-file or --proxy-header it serves its own machine only: every client
    that is not on a loopback address is refused.
    """
    err = safe_console(stderr=True)
    if new_token_for is not None:
        _new_token(token_file, new_token_for)
        return
    try:
        auth = _authenticator(token_file, proxy_header, trusted_proxy)
        if allowed_hosts and isinstance(auth, LoopbackOnly):
            raise ConsoleAuthError(
                "--allowed-host needs --token-file or --proxy-header: without them the "
                "console answers to localhost and loopback addresses only"
            )
        if isinstance(auth, TrustedProxyHeader) and not allowed_hosts:
            raise ConsoleAuthError(
                "behind a proxy, name the host the proxy serves with --allowed-host: a "
                "page under another name could otherwise send the user header itself"
            )
    except ConsoleAuthError as exc:
        err.print(f"[red]error:[/] {safe_text(exc)}")
        sys.exit(2)
    wiring = wired()
    settings = wiring.settings
    try:
        engine = wiring.engine(SERVICE_POOL)
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        err.print(
            f"[red]error:[/] BLACKBOX_DATABASE_URL is not a PostgreSQL URL this console can "
            f"use ({safe_text(exc)}); give one like "
            "postgresql+psycopg://USER:PASSWORD@HOST:5432/DATABASE"
        )
        sys.exit(2)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1 FROM blackbox_views.runs LIMIT 1"))
    except SQLAlchemyError as exc:
        detail = driver_cause(exc)
        err.print(
            f"[red]error:[/] the views cannot be read ({safe_text(detail)}); check "
            "BLACKBOX_DATABASE_URL (a blackbox_reader login, or blackbox_replayer to open "
            "bodies) and run `blackbox migrate`"
        )
        sys.exit(2)
    if isinstance(auth, LoopbackOnly) and not is_loopback(_resolved(host)):
        err.print(
            f"[yellow]note:[/] listening on {safe_text(host)} without authentication: only "
            "clients on this machine are served; give --token-file to serve others"
        )
    try:
        family = socket.AF_INET6 if ":" in _resolved(host) else socket.AF_INET
        with socket.create_server((host, port), family=family) as probe:
            port = port or int(probe.getsockname()[1])
    except OSError as exc:
        fix = "choose another --port" if exc.errno == errno.EADDRINUSE else "check --host"
        err.print(
            f"[red]error:[/] cannot listen on {safe_text(host)}:{port}: "
            f"{safe_text(exc.strerror or exc)}; {fix}"
        )
        sys.exit(2)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # noqa: S104 - shown, not bound
    err.print(f"console: http://{shown if ':' not in shown else f'[{shown}]'}:{port}/runs")
    err.print(f"authentication: {auth.description}")
    app = create_app(
        settings, engine, auth, allowed_hosts=allowed_hosts, secure_cookie=secure_cookie
    )
    # The client's address is the socket's peer: forwarding headers are never believed
    # (the trusted-proxy adapter checks the peer itself).
    config = uvicorn.Config(
        app, host=host, port=port, proxy_headers=False, server_header=False, log_level="info"
    )
    try:
        uvicorn.Server(config).run()
    finally:
        engine.dispose()


def _new_token(token_file: Path | None, name: str) -> None:
    """Write a generated token for ``name`` into ``token_file`` and print it (stdout, so a
    script can take it; the note goes to stderr)."""
    err = safe_console(stderr=True)
    try:
        if token_file is None:
            raise ConsoleAuthError("--new-token needs --token-file: the file to write it into")
        token = add_token(token_file, name)
    except ConsoleAuthError as exc:
        err.print(f"[red]error:[/] {safe_text(exc)}")
        sys.exit(2)
    click.echo(token)
    err.print(
        f"a new console token for {safe_text(name)} is in {safe_text(token_file)}; hand it "
        "to them now: it is not shown again (a running console reads the file at start)"
    )


def _authenticator(
    token_file: Path | None, proxy_header: str | None, trusted: tuple[str, ...]
) -> Authenticator:
    if token_file is not None and proxy_header is not None:
        raise ConsoleAuthError("choose one of --token-file and --proxy-header")
    if token_file is not None:
        return StaticTokens.from_file(token_file)
    if proxy_header is not None:
        return TrustedProxyHeader(proxy_header, trusted)
    if trusted:
        raise ConsoleAuthError("--trusted-proxy needs --proxy-header")
    return LoopbackOnly()


def _resolved(host: str) -> str:
    try:
        return str(socket.getaddrinfo(host, None)[0][4][0])
    except (OSError, IndexError):
        return host
