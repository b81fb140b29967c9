"""``blackbox``: the root group, composing every part's commands (``cli/commands/``).

A command's module is imported when the command is run (or listed, by ``--help``): the
parts behind the commands reach far (the consumers, the backup store's client, the run
console), and a command that loaded them all before doing anything started in a second
and a half.
"""

from __future__ import annotations

import faulthandler
import importlib
import logging
import signal
import sys

import click
from rich.logging import RichHandler

from agent_blackbox.cli._roles import RoleCheckedGroup
from agent_blackbox.cli._wiring import Wiring
from agent_blackbox.replayer import ReadSide
from agent_blackbox.schemas import env_flag, safe_console

console = safe_console(stderr=True)

_COMMANDS: dict[str, tuple[str, str]] = {
    "analytics": ("views", "analytics_command"),
    "backup": ("backup", "backup_group"),
    "consume": ("views", "consume_command"),
    "dataset": ("dataset", "dataset_group"),
    "demo": ("demo", "demo_command"),
    "drill": ("recovery", "drill_command"),
    "experiment": ("experiment", "experiment_group"),
    "export": ("export", "export_command"),
    "forget": ("retention", "forget_command"),
    "fork": ("fork", "fork_command"),
    "index-text": ("views", "index_text_command"),
    "keys": ("keys", "keys_group"),
    "ledger": ("retention", "ledger_group"),
    "migrate": ("migrate", "migrate_command"),
    "prices": ("prices", "prices_command"),
    "reexecute": ("fork", "reexecute_command"),
    "relay": ("relay", "relay_command"),
    "replay": ("replay", "replay_command"),
    "restore": ("recovery", "restore_command"),
    "retention": ("retention", "retention_group"),
    "runs": ("runs", "runs_command"),
    "schemas": ("schemas", "schemas_group"),
    "sign": ("views", "sign_command"),
    "stack": ("stack", "stack_group"),
    "stats": ("stats", "stats_command"),
    "tenants": ("tenants", "tenants_group"),
    "timeline": ("timeline", "timeline_command"),
    "verify": ("verify", "verify_command"),
    "web": ("web", "web_command"),
}
"""Each command's name → its module in ``agent_blackbox.cli.commands`` and its name there."""


def _stacks_on_signal() -> None:
    """``kill -USR1 <pid>`` prints where every thread of a long-running command is, to
    the process's stderr, without stopping it: the first thing to look at when a relay,
    a consumer or a backup seems stuck. Not where stderr is no file (a test's runner)."""
    stderr = sys.__stderr__
    if not hasattr(signal, "SIGUSR1") or stderr is None:
        return
    try:
        faulthandler.register(signal.SIGUSR1, file=stderr, all_threads=True)
    except (OSError, ValueError):  # no file descriptor behind it
        return


class _Commands(RoleCheckedGroup):
    """The root group, which imports each command's module the first time it is asked for
    the command."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is None and cmd_name in _COMMANDS:
            module, name = _COMMANDS[cmd_name]
            found = getattr(importlib.import_module(f"agent_blackbox.cli.commands.{module}"), name)
            assert isinstance(found, click.Command)
            self.add_command(found, cmd_name)
        return found


@click.group(cls=_Commands)
@click.option("-v", "--verbose", is_flag=True, help="Log debug detail.")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """agent-blackbox: a flight recorder for AI agents."""
    _stacks_on_signal()
    given = ctx.obj if isinstance(ctx.obj, ReadSide) else None
    try:  # a BLACKBOX_* variable with a bad value is named once, before any command runs
        # The composition root: the settings are read here, once per invocation, and
        # every command takes them (and its engines) from this object.
        ctx.obj = Wiring.from_env(given)
        for name in ("BLACKBOX_OTEL", "BLACKBOX_OTEL_CONTENT"):
            env_flag(name)
    except ValueError as exc:
        raise click.UsageError(f"{exc}; fix the variable or unset it") from None
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    # Alembic narrates every step at INFO; the commands say what was migrated.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # boto3 says where it found credentials on every client; nothing to act on.
    logging.getLogger("botocore").setLevel(logging.WARNING)
    # httpx logs every request a model client sends (a fork's, an experiment's hundreds,
    # a replay's answered ones); the commands say what came of them. SDKs built on the
    # httpx2 line log under that name.
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)
