"""The options that choose recorded runs, shared by ``blackbox experiment run`` and
``blackbox dataset create``: run ids, or filters over the views."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import click

from agent_blackbox.consumers import RunSelection
from agent_blackbox.schemas import PROMPT_VERSION_TAG, moment, tag_problem

FC = TypeVar("FC", bound=Callable[..., object])

_OPTIONS = (
    click.option("--agent-id", default=None, help="Only runs of this agent."),
    click.option(
        "--tag",
        "tags",
        multiple=True,
        metavar="NAME=VALUE",
        help="Only runs tagged so (repeatable: every tag must match).",
    ),
    click.option(
        "--prompt-version", default=None, help="Only runs of this prompt version (its tag)."
    ),
    click.option("--code-version", default=None, help="Only runs recorded by this code version."),
    click.option(
        "--status",
        type=click.Choice(["succeeded", "failed"]),
        default=None,
        help="Only runs that ended so (default: every finished run).",
    ),
    click.option(
        "--since",
        "since_raw",
        default=None,
        help="Only runs started since: a span back from now (30m, 1h, 2d, 1w) or an ISO time.",
    ),
    click.option("--until", "until_raw", default=None, help="Only runs started before this."),
    click.option(
        "--limit",
        type=click.IntRange(min=1, max=100_000),
        default=100,
        show_default=True,
        help="At most N runs, the newest first.",
    ),
    click.option("--include-forks", is_flag=True, help="Forks too (left out by default)."),
)


def selection_options(fn: FC) -> FC:
    """The filters of :func:`run_selection`, as options."""
    for option in reversed(_OPTIONS):
        fn = option(fn)
    return fn


def run_selection(run_ids: tuple[str, ...], **given: Any) -> RunSelection:
    """The runs the options choose: ``run_ids`` when given (then no filter may be), else
    the filters.

    Raises:
        click.UsageError: run ids and filters together, or a filter that is malformed.
    """
    filters = {k: v for k, v in given.items() if v not in (None, (), False, 100)}
    if run_ids and filters:
        names = ", ".join("--" + k.removesuffix("_raw").replace("_", "-") for k in filters)
        raise click.UsageError(f"give RUN_IDs or filters ({names}), not both")
    if run_ids:
        return RunSelection(run_ids=tuple(dict.fromkeys(run_ids)))
    tags = _tags(given["tags"])
    if given["prompt_version"]:
        tags[PROMPT_VERSION_TAG] = given["prompt_version"]
    since = moment_given(given["since_raw"], "--since")
    until = moment_given(given["until_raw"], "--until")
    if since is not None and until is not None and until <= since:
        raise click.UsageError("--until is not after --since: nothing could match")
    return RunSelection(
        agent=given["agent_id"],
        tags=tags,
        code_version=given["code_version"],
        status=given["status"],
        since=since,
        until=until,
        limit=given["limit"],
        include_forks=given["include_forks"],
    )


def _tags(pairs: tuple[str, ...]) -> dict[str, str]:
    tags = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint="--tag")
        if (problem := tag_problem(name, value)) is not None:
            raise click.BadParameter(problem, param_hint="--tag")
        tags[name] = value
    return tags


def moment_given(raw: str | None, option: str) -> datetime | None:
    """``30m``, ``1h``, ``2d``, ``1w`` back from now, or an ISO time (local without a
    zone), as given to ``option``; None when not given.

    Raises:
        click.BadParameter: naming the option and the forms it takes.
    """
    if raw is None:
        return None
    try:
        return moment(raw)
    except ValueError:
        raise click.BadParameter(
            f"{raw!r}: give a span back from now (30m, 1h, 2d, 1w) or an ISO time such "
            "as 2026-12-01T09:00",
            param_hint=option,
        ) from None
