"""``blackbox fork`` and ``blackbox reexecute``: start again from a recorded run."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from sqlalchemy import Engine

from agent_blackbox.cli._purpose import purpose_option
from agent_blackbox.cli._wiring import Wiring, wired
from agent_blackbox.replayer import (
    ForkResult,
    KafkaRunSource,
    ToolMode,
    check_routes,
    endpoints_for,
    fork_diff,
    fork_run,
    load_entry,
    read_archive,
    reexecute,
)
from agent_blackbox.replayer._access import opening, recording_keys
from agent_blackbox.replayer._fork import TOOL_MODES
from agent_blackbox.replayer._fork_diff import CallPair, ForkDiff
from agent_blackbox.replayer._reexecute import APIS, load_request_mapper
from agent_blackbox.schemas import (
    BlackboxError,
    Envelope,
    EventType,
    permission_refused,
    safe_console,
    safe_text,
)

__all__ = ["fork_command", "reexecute_command"]


def _parent_events(
    wiring: Wiring, run_id: str, archive: Path | None
) -> tuple[list[Envelope], Engine | None]:
    """The run's events, from ``archive``, or from the topic through the run index (and
    the engine made for that)."""
    if archive is not None:
        events = list(read_archive(archive, run_id=run_id))
        if not events:
            raise BlackboxError(f"run {run_id} is not in {archive}")
        return events, None
    engine = wiring.engine()
    index = wiring.read_side.run_index(engine)
    return list(KafkaRunSource(wiring.settings, index, run_id)), engine


def _changes(pairs: tuple[str, ...]) -> dict[str, str]:
    changes = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--set")
        changes[key] = value
    return changes


@click.command("fork")
@click.argument("run_id")
@click.option(
    "--agent",
    "factory_path",
    required=True,
    help="Fork factory module:function, called as factory(snapshot, base_url=, api_key=).",
)
@click.option("--set", "pairs", multiple=True, help="A change: model=…, prompt=…, flag.X=…")
@click.option("--base-url", required=True, help="OpenAI-compatible endpoint of the model.")
@click.option(
    "--api-key-env",
    default="OPENAI_API_KEY",
    show_default=True,
    help="Environment variable holding the endpoint's key (never recorded).",
)
@click.option(
    "--tools",
    type=click.Choice(TOOL_MODES),
    default="recorded",
    show_default=True,
    help="recorded: answer tools from the parent's recording only; live: call them; "
    "recorded-then-live: from the recording while the fork's calls are the parent's, "
    "live from the first that differs.",
)
@click.option(
    "--effects",
    type=click.Choice(["refuse", "sandbox"]),
    default="refuse",
    show_default=True,
    help="refuse: every effect fails; sandbox: confirmed and written down, never sent.",
)
@click.option(
    "--archive",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Read the parent from an Avro archive instead of Kafka.",
)
@click.option("--dry-run", is_flag=True, help="Record the fork in memory, not in the outbox.")
@purpose_option(required=True)
@click.option("--json", "as_json", is_flag=True, help="The fork and its diff as JSON on stdout.")
def fork_command(
    run_id: str,
    factory_path: str,
    pairs: tuple[str, ...],
    base_url: str,
    api_key_env: str,
    tools: ToolMode,
    effects: str,
    archive: Path | None,
    dry_run: bool,
    purpose: str,
    as_json: bool,
) -> None:
    """Re-execute RUN_ID as a new run from its input snapshot, with changes, and show
    what changed next to the parent: the final output, the tool calls, the LLM calls.

    Exit status: 0 when the fork succeeded, 1 when it failed, 2 when it could not run
    as asked (a bad option, a parent that cannot be read, a tool call the parent never
    made with --tools recorded).
    """
    console = safe_console(stderr=True)
    changes = _changes(pairs)
    wiring = wired()
    engine: Engine | None = None
    try:
        factory = load_entry(factory_path)
        parent, engine = _parent_events(wiring, run_id, archive)
        engine = engine or wiring.engine()
        reading = opening(lambda: engine, purpose=purpose)
        result = fork_run(
            parent,
            factory,
            changes=changes,
            base_url=base_url,
            api_key=os.environ.get(api_key_env, "not-set"),
            tools=tools,
            effects="sandbox" if effects == "sandbox" else "refuse",
            engine=None if dry_run else engine,
            settings=wiring.settings,
            pipeline=reading.pipeline,
            digests=reading.digests,
            keys=recording_keys(),
        )
        diff = fork_diff(parent, result, pipeline=reading.pipeline)
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        console.print(f"[red]error:[/] {safe_text(str(exc))}")
        sys.exit(2)
    finally:
        if engine is not None:
            engine.dispose()
    summary = {
        "run_id": result.run_id,
        "parent_run_id": result.parent_run_id,
        "changes": dict(result.changes),
        "tools": result.tools,
        "status": result.status,
        "error": result.error,
        "sandboxed_effects": len(result.sandboxed_effects),
        "recorded": "memory" if dry_run else "outbox",
        "diff": diff.to_dict(),
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
    else:
        _print_fork(result, diff, safe_console())
    if result.unrecorded_tool is not None:
        console.print(f"[red]error:[/] {safe_text(result.unrecorded_tool)}")
        sys.exit(2)
    sys.exit(0 if result.status == "succeeded" else 1)


def _print_fork(result: ForkResult, diff: ForkDiff, console: Console) -> None:
    console.print(
        f"fork {safe_text(result.run_id)} of {safe_text(result.parent_run_id)}: {result.status}"
        + (f" ({safe_text(result.error)})" if result.error else "")
        + f"; parent {diff.status[0]}; changes {safe_text(json.dumps(dict(result.changes)))}"
        + f"; tools {result.tools}"
    )
    if diff.output_changes:
        table = Table(title="Final output", title_justify="left")
        for column in ("path", "parent", "fork"):
            table.add_column(column)
        for change in diff.output_changes:
            table.add_row(safe_text(change.path), _cell(change.parent), _cell(change.fork))
        console.print(table)
    else:
        console.print("final output: the same as the parent's")
    _print_pairs("Tool calls", diff.tool_calls, _tool_cell, console)
    _print_pairs("LLM calls", diff.llm_calls, _llm_cell, console)


def _print_pairs(
    title: str,
    pairs: Sequence[CallPair],
    cell: Callable[[Mapping[str, Any] | None], str],
    console: Console,
) -> None:
    if not pairs:
        console.print(f"{title.lower()}: none in either run")
        return
    table = Table(title=title, title_justify="left")
    for column in ("#", "parent", "fork", "changed"):
        table.add_column(column)
    for pair in pairs:
        changed = "same" if pair.same else safe_text(", ".join(pair.changed))
        table.add_row(str(pair.index + 1), cell(pair.parent), cell(pair.fork), changed)
    console.print(table)


def _tool_cell(call: Mapping[str, Any] | None) -> str:
    if call is None:
        return "-"
    text = f"{call['tool']}({_arguments(call['arguments'])})"
    if call.get("error"):
        text += f" raised {call['error']}"
    if call.get("source"):
        text += f" ({call['source']})"
    return safe_text(text)


def _arguments(recorded: Any) -> str:
    """A tool call's arguments as the call wrote them: ``"Paris", unit="C"``."""
    if not isinstance(recorded, Mapping):
        return _cell(recorded)
    args = [json.dumps(a, default=str) for a in recorded.get("args") or []]
    kwargs = [
        f"{k}={json.dumps(v, default=str)}" for k, v in (recorded.get("kwargs") or {}).items()
    ]
    return _clip(", ".join(args + kwargs))


def _llm_cell(call: Mapping[str, Any] | None) -> str:
    if call is None:
        return "-"
    if call.get("error"):
        return safe_text(f"{call['model']} raised {call['error']}")
    text = " | ".join(t for t in call["text"] if t) or ""
    calls = [f"{c['name']}({_cell(c['arguments'])})" for tcs in call["tool_calls"] for c in tcs]
    finish = ",".join(str(f) for f in call["finish_reason"])
    return safe_text(f"{call['model']} [{finish}] {_clip(text)} {' '.join(calls)}".strip())


def _cell(value: Any) -> str:
    return safe_text(_clip(json.dumps(value, default=str, ensure_ascii=False)))


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


_KEY_VARIABLES = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


def _by_api(values: tuple[str, ...], option: str) -> str | dict[str, str]:
    """The values of a repeatable option: one for every API, or one per API named as
    ``openai=...`` or ``anthropic=...``."""
    named: dict[str, str] = {}
    plain = []
    for value in values:
        api, sep, rest = value.partition("=")
        if not sep or api not in APIS:
            plain.append(value)
        elif api in named:
            raise click.BadParameter(f"{api}= is given twice", param_hint=option)
        else:
            named[api] = rest
    if len(plain) + bool(named) > 1:
        raise click.BadParameter(
            f"give one value for every API, or one per API ({option} openai=... "
            f"{option} anthropic=...)",
            param_hint=option,
        )
    return plain[0] if plain else named


def _api_keys(key_envs: tuple[str, ...]) -> dict[str, str]:
    """Each API's key, from the variable ``--api-key-env`` names for it (or for all),
    else from its own (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``)."""
    given = _by_api(key_envs, "--api-key-env") if key_envs else {}
    return {
        api: os.environ.get(
            given if isinstance(given, str) else given.get(api, _KEY_VARIABLES[api]), "not-set"
        )
        for api in APIS
    }


@click.command("reexecute")
@click.argument("run_id")
@click.option(
    "--base-url",
    "base_urls",
    required=True,
    multiple=True,
    metavar="[API=]URL",
    help="Endpoint to re-send to: OpenAI-compatible, or the Anthropic API (see --provider). "
    "A run that called both needs one per API: --base-url openai=URL --base-url "
    "anthropic=URL.",
)
@click.option(
    "--provider",
    "api",
    type=click.Choice(APIS),
    default=None,
    help="The API the endpoint speaks. Default: each call's own (Anthropic calls as "
    "Anthropic Messages requests, the others as OpenAI-compatible ones). A call recorded "
    "with the other API needs --request-mapper.",
)
@click.option(
    "--request-mapper",
    "mapper_path",
    default=None,
    help="module:function turning a recorded request into one for the endpoint's API "
    "(called as function(request) -> request), for calls recorded with the other API.",
)
@click.option(
    "--api-key-env",
    "key_envs",
    multiple=True,
    metavar="[API=]VARIABLE",
    help="Environment variable holding the endpoint's key (never recorded), for every API "
    "or per API (openai=VARIABLE, anthropic=VARIABLE). Default: OPENAI_API_KEY for an "
    "OpenAI-compatible endpoint, ANTHROPIC_API_KEY for Anthropic.",
)
@click.option(
    "--archive",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Read the run from an Avro archive instead of Kafka.",
)
@purpose_option(required=True)
@click.option(
    "--json", "as_json", is_flag=True, help="Per-call structured diffs as JSON on stdout."
)
def reexecute_command(
    run_id: str,
    base_urls: tuple[str, ...],
    api: str | None,
    mapper_path: str | None,
    key_envs: tuple[str, ...],
    archive: Path | None,
    purpose: str,
    as_json: bool,
) -> None:
    """Re-send each recorded LLM request of RUN_ID and diff the answers per call: text,
    finish reason, tool calls (name and parsed arguments) and usage; ids, creation
    times and system fingerprints are ignored. A streamed call is re-sent streamed.

    Exit status: 0 when every answer is the same, 1 when one differs or failed, 2 when
    the run could not be read or a call cannot be sent as asked (the endpoint speaks
    another API than the call and no --request-mapper was given; one --base-url for a
    run that called both APIs).
    """
    console = safe_console(stderr=True)
    base_url, api_keys = _by_api(base_urls, "--base-url"), _api_keys(key_envs)
    wiring = wired()
    engine: Engine | None = None
    try:
        events, engine = _parent_events(wiring, run_id, archive)
        engine = engine or wiring.engine()
        pipeline = opening(lambda: engine, purpose=purpose).pipeline
        mapper = None if mapper_path is None else load_request_mapper(mapper_path)
        send = endpoints_for(events, base_url, api_key=api_keys, api=api)
        check_routes(events, send, request_mapper=mapper)  # before any request is sent
        diffs = reexecute(
            _progress(events, console), send, pipeline=pipeline, request_mapper=mapper
        )
    except BlackboxError as exc:
        if permission_refused(exc) is not None:
            raise  # the top-level command names the role to run as
        console.print(f"[red]error:[/] {safe_text(str(exc))}")
        sys.exit(2)
    finally:
        if engine is not None:
            engine.dispose()
    if as_json:
        rows = [d.to_dict() for d in diffs]
        click.echo(json.dumps({"run_id": run_id, "calls": rows}, indent=2, default=str))
    else:
        where = ", ".join(base_urls)
        table = Table(title=f"LLM calls of {run_id}, re-sent to {safe_text(where)}")
        for column in ("sequence", "model", "result", "changed"):
            table.add_column(column)
        for d in diffs:
            result = "same" if d.same else ("error" if d.error else "differs")
            notes = [f"{k} not compared: {v}" for k, v in d.uncompared.items()]
            detail = d.error or ", ".join([*d.changed, *notes])
            table.add_row(str(d.sequence), safe_text(d.model), result, safe_text(detail))
        safe_console().print(table)
    sys.exit(0 if all(d.same for d in diffs) else 1)


def _progress(events: list[Envelope], console: Console) -> Iterator[Envelope]:
    """``events``, with a progress bar over the LLM calls re-sent (each is a round trip)."""
    calls = sum(e.event_type == EventType.LLM_CALL for e in events)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("re-sending LLM calls", total=calls)
        for envelope in events:
            yield envelope
            if envelope.event_type == EventType.LLM_CALL:
                progress.advance(task)
