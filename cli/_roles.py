"""Which role each command runs as, and what a command says when the database refuses it.

A permission error (SQLSTATE 42501) means the command connected as the wrong role, or its
login lacks a grant: retrying cannot help and a traceback helps nobody. Every command
therefore stops at once with exit 2, naming what the database refused, the login it
connected as, and the role that the table "Which role each process connects as" of
docs/guides/privacy-security.md gives the command.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from agent_blackbox.cli._wiring import wired
from agent_blackbox.schemas import permission_refused, safe_console, safe_text

_OWNER = "the owner of both schemas (the migrations' user)"
_VIEWS_OWNER = "the owner of blackbox_views"
_REPLAYER = "a blackbox_replayer login granted the run's tenant"

ROLES: dict[str, str] = {
    "relay": "a blackbox_relay login",
    "consume": _VIEWS_OWNER,
    "analytics": _VIEWS_OWNER,
    "index-text": f"{_VIEWS_OWNER}, with BLACKBOX_KEK_FILE for sealed runs",
    "stats": "a blackbox_reader login granted the tenants to count",
    "runs": "a blackbox_reader login granted the tenants to list",
    "prices": "none: it reads no database",
    "sign": f"{_VIEWS_OWNER}, also a member of blackbox_reader granted tenant '*'",
    "verify": (
        "a blackbox_reader login granted the runs' tenants (blackbox_replayer to check "
        "out-of-line bodies too)"
    ),
    "replay": _REPLAYER,
    "fork": _REPLAYER,
    "reexecute": _REPLAYER,
    "experiment": f"{_REPLAYER} (list and show: a blackbox_reader login is enough)",
    "dataset": (
        f"{_REPLAYER} to create or delete one (list and show: a blackbox_reader login; "
        "export: as blackbox export)"
    ),
    "timeline": f"{_REPLAYER} (without --bodies, a blackbox_reader login is enough)",
    "export": (
        f"{_REPLAYER} with --bodies (without, a blackbox_reader login granted the runs' "
        "tenants is enough)"
    ),
    "web": "a blackbox_reader login (a blackbox_replayer login to open bodies)",
    "retention": _OWNER,
    "forget": _OWNER,
    "ledger": _OWNER,
    "tenants": _OWNER,
    "keys": _OWNER,
    "migrate": _OWNER,
    "demo": _OWNER,
}
"""Command (its first word) → the role it runs as: the role table of
docs/guides/privacy-security.md."""


def role_for(command: str) -> str:
    """The role the documentation gives ``command`` (its first word after ``blackbox``)."""
    return ROLES.get(command, _OWNER)


class RoleCheckedGroup(click.Group):
    """The top-level group: a permission error from any command, however deep in its
    exception chain, becomes one line naming the refusal and the right role, and exit 2."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        # The name shown: a group's first subcommand word too (`ledger reapply`).
        words = [name or ""]
        if isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
            words.append(rest[0])
        ctx.meta[_COMMAND_KEY] = " ".join(words)
        return name, command, rest

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:  # every command's, so none leaks a permission traceback
            refusal = permission_refused(exc)
            if refusal is None:
                raise
            _refused(str(ctx.meta.get(_COMMAND_KEY, "")), refusal, _login(ctx))


_COMMAND_KEY = "agent_blackbox.command"


def _login(ctx: click.Context) -> str:
    """The login the command connected as, from the invocation's settings."""
    try:
        user = make_url(wired(ctx).settings.database_url).username
    except (ArgumentError, ValueError):
        return "its login"
    return f"login {user!r}" if user else "its login"


def _refused(command: str, refusal: str, login: str) -> NoReturn:
    role = role_for(command.split(" ")[0])
    safe_console(stderr=True).print(
        f"[red]error:[/] the database refused `blackbox {safe_text(command)}` "
        f"({safe_text(login)}): {safe_text(refusal)}. Retrying cannot help: run it as {role} "
        '(docs/guides/privacy-security.md, "Which role each process connects as"); '
        "the refused statement changed nothing",
        soft_wrap=True,
    )
    sys.exit(2)
