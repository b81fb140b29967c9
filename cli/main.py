"""``blackbox``: the root group, composing every part's commands (``cli/commands/``)."""

from __future__ import annotations

import logging

import click
from rich.logging import RichHandler

from agent_blackbox.cli._roles import RoleCheckedGroup
from agent_blackbox.cli._wiring import Wiring
from agent_blackbox.cli.commands.backup import backup_group
from agent_blackbox.cli.commands.dataset import dataset_group
from agent_blackbox.cli.commands.demo import demo_command
from agent_blackbox.cli.commands.experiment import experiment_group
from agent_blackbox.cli.commands.export import export_command
from agent_blackbox.cli.commands.fork import fork_command, reexecute_command
from agent_blackbox.cli.commands.keys import keys_group
from agent_blackbox.cli.commands.migrate import migrate_command
from agent_blackbox.cli.commands.prices import prices_command
from agent_blackbox.cli.commands.recovery import drill_command, restore_command
from agent_blackbox.cli.commands.relay import relay_command
from agent_blackbox.cli.commands.replay import replay_command
from agent_blackbox.cli.commands.retention import forget_command, ledger_group, retention_group
from agent_blackbox.cli.commands.runs import runs_command
from agent_blackbox.cli.commands.schemas import schemas_group
from agent_blackbox.cli.commands.stack import stack_group
from agent_blackbox.cli.commands.stats import stats_command
from agent_blackbox.cli.commands.tenants import tenants_group
from agent_blackbox.cli.commands.timeline import timeline_command
from agent_blackbox.cli.commands.verify import verify_command
from agent_blackbox.cli.commands.views import (
    analytics_command,
    consume_command,
    index_text_command,
    sign_command,
)
from agent_blackbox.cli.commands.web import web_command
from agent_blackbox.replayer import ReadSide
from agent_blackbox.schemas import env_flag, safe_console

console = safe_console(stderr=True)


@click.group(cls=RoleCheckedGroup)
@click.option("-v", "--verbose", is_flag=True, help="Log debug detail.")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """agent-blackbox: a flight recorder for AI agents."""
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
    # httpx logs every request a model client sends (a fork's, an experiment's hundreds);
    # the commands say what came of them.
    logging.getLogger("httpx").setLevel(logging.WARNING)


for _command in (
    stack_group,
    consume_command,
    analytics_command,
    index_text_command,
    stats_command,
    runs_command,
    prices_command,
    replay_command,
    fork_command,
    reexecute_command,
    experiment_group,
    dataset_group,
    schemas_group,
    retention_group,
    forget_command,
    ledger_group,
    verify_command,
    timeline_command,
    export_command,
    sign_command,
    keys_group,
    tenants_group,
    backup_group,
    drill_command,
    restore_command,
    web_command,
    migrate_command,
    relay_command,
    demo_command,
):
    main.add_command(_command)
