"""``--purpose``: why a command reads recorded bodies, written to the access audit."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from agent_blackbox.keystore import purpose_problem

FC = TypeVar("FC", bound=Callable[..., object])


def _checker(required: bool) -> Callable[[click.Context, click.Parameter, str | None], str | None]:
    def check(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is None and required:
            # click's own refusal names the option only; the variable works too.
            raise click.MissingParameter(
                'say why recorded bodies are read (--purpose "..." or BLACKBOX_PURPOSE): '
                "it is written to the access audit",
                param=param,
            )
        if value is not None and (problem := purpose_problem(value)) is not None:
            raise click.BadParameter(problem)
        return value

    return check


def purpose_option(*, required: bool) -> Callable[[FC], FC]:
    """The ``--purpose`` option (``BLACKBOX_PURPOSE``) of every command that reads bodies;
    a purpose :func:`~agent_blackbox.keystore.purpose_problem` finds fault with, or none
    where one is required, is a usage error (exit 2)."""
    return click.option(
        "--purpose",
        envvar="BLACKBOX_PURPOSE",
        callback=_checker(required),
        help="Why recorded bodies are read (one line, 3-500 characters); written to the "
        "access audit with every key unwrapped. Default: BLACKBOX_PURPOSE."
        + (" Required." if required else ""),
    )
