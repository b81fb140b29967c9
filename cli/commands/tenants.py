"""``blackbox tenants``: which tenants each database role may write, read or replay."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn, TypeVar

import click
from rich.table import Table
from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from agent_blackbox.cli._wiring import wired
from agent_blackbox.consumers import (
    disable_text_search_txn,
    enable_text_search_txn,
    text_search_tenants_txn,
)
from agent_blackbox.outbox._tenants import (
    EVERY_TENANT,
    grant_tenant_txn,
    revoke_tenant_txn,
    tenant_grants_txn,
)
from agent_blackbox.schemas import permission_refused, safe_console, safe_text

T = TypeVar("T")


@click.group("tenants")
def tenants_group() -> None:
    """Tenant grants: a writer starts runs only for its granted tenants, and readers and
    replayers see only their granted tenants' runs (row-level security). Run these as the
    schema's owner (the migrations' user)."""


def _apply(change: Callable[[Connection, str, str], T], role: str, tenant: str) -> T:
    """``change`` in a transaction of its own; bad names are a usage error (exit 2)."""
    engine = wired().engine()
    try:
        with engine.begin() as conn:
            return change(conn, role, tenant)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    except SQLAlchemyError as exc:
        _could_not_run(exc, "change")
    finally:
        engine.dispose()


def _could_not_run(exc: SQLAlchemyError, doing: str) -> NoReturn:
    if permission_refused(exc) is not None:
        raise exc  # the top-level command names the role to run as
    first = str(exc).splitlines()[0]
    safe_console(stderr=True).print(
        f"[red]could not {doing} the tenants:[/] {safe_text(first)}; run as the schema's owner "
        "against a migrated database (blackbox migrate; BLACKBOX_DATABASE_URL)"
    )
    raise SystemExit(2)


@tenants_group.command("grant")
@click.argument("role")
@click.argument("tenant")
def grant(role: str, tenant: str) -> None:
    """Let ROLE (a login user or a group role) act for TENANT ('*': every tenant)."""
    _apply(grant_tenant_txn, role, tenant)
    every = " (every tenant)" if tenant == EVERY_TENANT else ""
    safe_console().print(f"granted tenant {safe_text(tenant)}{every} to role {safe_text(role)}")


@tenants_group.command("revoke")
@click.argument("role")
@click.argument("tenant")
def revoke(role: str, tenant: str) -> None:
    """Take TENANT back from ROLE (runs it is recording carry on; new ones are refused)."""
    if not _apply(revoke_tenant_txn, role, tenant):
        safe_console(stderr=True).print(
            f"role {safe_text(role)} had no grant of tenant {safe_text(tenant)}; nothing changed"
        )
        raise SystemExit(1)
    safe_console().print(f"revoked tenant {safe_text(tenant)} from role {safe_text(role)}")


@tenants_group.command("list")
@click.option("--role", default=None, help="Only this role's grants.")
def list_grants(role: str | None) -> None:
    """The grants, role by role."""
    engine = wired().engine()
    try:
        with engine.connect() as conn:
            grants = tenant_grants_txn(conn, role)
    except SQLAlchemyError as exc:
        _could_not_run(exc, "read")
    finally:
        engine.dispose()
    table = Table("role", "tenant")
    for name, tenant in grants:
        table.add_row(safe_text(name), safe_text(tenant))
    safe_console().print(table if grants else "no tenant grants")


@tenants_group.command("search")
@click.argument("tenant", required=False)
@click.option("--on", "turn", flag_value="on", help="Opt TENANT in to full-text search.")
@click.option(
    "--off", "turn", flag_value="off", help="Opt TENANT out, and delete its words from the index."
)
def search(tenant: str | None, turn: str | None) -> None:
    """Full-text search over TENANT's LLM messages (as recorded, so redacted): --on to
    opt in (`blackbox index-text` then indexes the calls it reads from there on), --off
    to opt out and delete what was indexed. Without a flag: the tenants that opted in."""
    if turn is None:
        _searchable(tenant)
        return
    if tenant is None:
        raise click.UsageError("name the TENANT to turn full-text search on or off for")
    if turn == "on":
        fresh = _apply(lambda conn, _r, t: enable_text_search_txn(conn, t), "", tenant)
        said = "on" if fresh else "on already"
        safe_console().print(f"full-text search {said} for tenant {safe_text(tenant)}")
        return
    was_on, dropped = _apply(lambda conn, _r, t: disable_text_search_txn(conn, t), "", tenant)
    safe_console().print(
        f"full-text search off for tenant {safe_text(tenant)}"
        f"{'' if was_on else ' (it was not on)'}; {dropped:,} calls' words deleted"
    )


def _searchable(tenant: str | None) -> None:
    engine = wired().engine()
    try:
        with engine.connect() as conn:
            found = text_search_tenants_txn(conn)
    except SQLAlchemyError as exc:
        _could_not_run(exc, "read")
    finally:
        engine.dispose()
    found = [t for t in found if tenant is None or t.tenant_id == tenant]
    if not found:
        safe_console().print("no tenant has full-text search on")
        raise SystemExit(1)
    table = Table("tenant", "on since (UTC)", "by", "calls indexed")
    for t in found:
        at = t.enabled_at.strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(safe_text(t.tenant_id), at, safe_text(t.enabled_by), f"{t.indexed_calls:,}")
    safe_console().print(table)
