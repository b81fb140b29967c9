"""What the long-running workers share (``relay``, ``consume``, ``analytics``, ``sign``,
``retention run``, ``backup run``): their options, metrics, signals and group
membership, and how a command says it could not run."""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from types import FrameType
from typing import Any, NoReturn, TypeVar

import click
from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from rich.console import Console
from sqlalchemy.exc import InterfaceError, OperationalError

from agent_blackbox.schemas import (
    BlackboxError,
    Settings,
    driver_cause,
    permission_refused,
    safe_console,
    safe_text,
    unreachable_database,
)

until_idle_option = click.option(
    "--until-idle",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Drain and exit: stop once nothing came to do for SECONDS (default: run until "
    "SIGTERM/SIGINT). Exit 0 when stopped, 2 when the work could not run.",
)
"""``--until-idle`` of every long-running worker (``consume``, ``sign``, ``relay``): the
same meaning, the same output (progress on stderr, one summary line on stdout) and the
same exit statuses for all."""

metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(min=1, max=65535),
    default=None,
    help="Serve Prometheus metrics on 127.0.0.1:PORT (/metrics).",
)
"""``--metrics-port`` of every long-running worker (``relay``, ``consume``, ``analytics``,
``sign``, ``retention run``, ``backup run``): one convention for all."""


def serve_metrics(port: int | None, registry: CollectorRegistry = REGISTRY) -> None:
    """Serve ``registry`` on 127.0.0.1:``port`` (nothing when ``port`` is None).

    Raises:
        BlackboxError: the port cannot be bound (taken, or not allowed).
    """
    if port is None:
        return
    try:
        start_http_server(port, addr="127.0.0.1", registry=registry)
    except OSError as exc:
        raise BlackboxError(
            f"cannot serve metrics on 127.0.0.1:{port}: {exc.strerror}; choose another "
            "--metrics-port"
        ) from exc


F = TypeVar("F", bound=Callable[..., Any])


def membership_options(name: str) -> Callable[[F], F]:
    """``--instance-id`` and ``--session-timeout`` of a consumer command; ``name`` is the
    consumer's name, the default instance id's first part."""

    def decorate(command: F) -> F:
        return _membership_options(command, name)

    return decorate


def _membership_options(command: F, name: str) -> F:
    command = click.option(
        "--session-timeout",
        type=click.FloatRange(min=1),
        default=None,
        metavar="SECONDS",
        help="How long the group waits for a silent member before moving its partitions "
        "(default BLACKBOX_CONSUMER_SESSION_TIMEOUT_MS, 6 s; the broker's "
        "group.min.session.timeout.ms is the floor).",
    )(command)
    return click.option(
        "--instance-id",
        default=None,
        help="Static group membership: restarted with the same id, the consumer gets its "
        "partitions back at once. Unique per consumer of a group (default "
        f"BLACKBOX_CONSUMER_INSTANCE_ID, else {name}@HOST, {name}@HOST#2 for a second one "
        "running on the host, ...); an empty value joins without one.",
    )(command)


@contextmanager
def membership(
    settings: Settings, *, name: str, instance_id: str | None, session_timeout: float | None
) -> Iterator[Settings]:
    """``settings`` with the group membership the command line asked for; without an
    instance id, this process's slot on the host (see
    :func:`agent_blackbox.consumers._membership.host_member_id`) is held while the block runs."""
    timeout_ms = settings.consumer_session_timeout_ms
    if session_timeout is not None:
        timeout_ms = round(session_timeout * 1000)
    chosen = settings.consumer_instance_id if instance_id is None else instance_id
    # Loaded here: the group membership is the long-running workers' alone, and every
    # command imports this module.
    from agent_blackbox.consumers._membership import host_member_id

    slot = (
        nullcontext(chosen) if chosen is not None else host_member_id(name, settings.consumer_group)
    )
    with slot as member:
        yield dataclasses.replace(
            settings, consumer_instance_id=member, consumer_session_timeout_ms=timeout_ms
        )


def idle_notice(console: Console, seconds: float, *, detail: str = "") -> None:
    """What a worker says when ``--until-idle`` stops it (``detail``: what it had
    finished, e.g. " (3 assigned partitions read to their end)")."""
    console.log(f"idle for {seconds:g} s: stopping{detail}")


def could_not_run(console: Console, exc: BlackboxError) -> NoReturn:
    """Say why a command could not run, and exit 2."""
    console.print(f"[red]error:[/] {safe_text(str(exc))}", soft_wrap=True)
    sys.exit(2)


DATABASE_DOWN = (OperationalError, InterfaceError)
"""What SQLAlchemy raises when the database cannot be reached or dropped the session."""


def database_unreachable(exc: Exception) -> BlackboxError:
    """A database that could not be reached, as a command says it: the driver's first
    line and what to check."""
    return BlackboxError(unreachable_database(driver_cause(exc)))


def views_unread(exc: Exception, what: str) -> BlackboxError:
    """Why ``what`` (a set of views) could not be read: the driver's first line, and what
    to check, rather than the driver's whole message with its SQL."""
    return BlackboxError(
        f"cannot read {what}: {driver_cause(exc)}; check BLACKBOX_DATABASE_URL, that Postgres "
        "is up (blackbox stack up, locally) and that the views were built (blackbox consume)"
    )


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Set ``stop`` on SIGTERM/SIGINT (in-flight work finishes first: a view batch is
    committed, a backup cut written); the handlers that were there come back after."""

    def handle(signum: int, _frame: FrameType | None) -> None:
        safe_console(stderr=True).print(
            f"received {signal.Signals(signum).name}: finishing in-flight work"
        )
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def guarded(work: Callable[[], object], console: Console) -> None:
    """Run ``work``; a :class:`BlackboxError` is said on ``console`` and exits 2 (a
    permission error goes on up, for the root group to name the role to run as)."""
    try:
        work()
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        could_not_run(console, exc)
