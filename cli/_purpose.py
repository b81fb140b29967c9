"""``--purpose``: why a command reads recorded bodies, written to the access audit."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from agent_blackbox.keystore import purpose_problem

FC = TypeVar("FC", bound=Callable[..., object])


def _check_purpose(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None and (problem := purpose_problem(value)) is not None:
        raise click.BadParameter(problem)
    return value


def purpose_option(*, required: bool) -> Callable[[FC], FC]:
    """The ``--purpose`` option (``BLACKBOX_PURPOSE``) of every command that reads bodies;
    a purpose :func:`~agent_blackbox.keystore.purpose_problem` finds fault with is a usage
    error (exit 2)."""
    # No explicit default: click then refuses a required option that is missing.
    return click.option(
        "--purpose",
        envvar="BLACKBOX_PURPOSE",
        required=required,
        callback=_check_purpose,
        help="Why recorded bodies are read (one line, 3-500 characters); written to the "
        "access audit with every key unwrapped.",
    )
