"""``blackbox prices``: the LLM price table the analytics consumer prices calls with."""

from __future__ import annotations

import json

import click
from rich import box
from rich.table import Table

from agent_blackbox.cli._wiring import wired
from agent_blackbox.cli._workers import could_not_run
from agent_blackbox.consumers import PriceFileError, PriceTable, dollars_json
from agent_blackbox.schemas import safe_console, safe_text


@click.command("prices")
@click.option(
    "--file",
    "path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Check this price file (TOML, or JSON for a .json name) instead of "
    "BLACKBOX_PRICE_FILE, and show the table it makes.",
)
@click.option("--model", default=None, help="Show the price this model name is charged at.")
@click.option("--provider", default="openai", show_default=True, help="The provider of --model.")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per entry on stdout.")
def prices_command(path: str | None, model: str | None, provider: str, as_json: bool) -> None:
    """The prices in force (US dollars per million tokens, with the day each was taken):
    the shipped table with the entries of BLACKBOX_PRICE_FILE (or --file) over it. A
    malformed file exits 2 naming the entry and what is wrong: check a new file here
    before the analytics consumer reads it. Needs no database."""
    console = safe_console(stderr=True, log_path=False)
    try:
        table = PriceTable.load(path if path is not None else wired().settings.price_file)
    except PriceFileError as exc:
        could_not_run(console, exc)
    entries = list(table)
    if model is not None:
        found = table.price(provider, model)
        if found is None:
            console.print(
                f"{safe_text(provider)} {safe_text(model)} has no price: its calls are "
                "counted as unpriced; add an entry to BLACKBOX_PRICE_FILE"
            )
            raise SystemExit(1)
        entries = [found]
    if as_json:
        for price in entries:
            figures = {k: dollars_json(getattr(price, k)) for k in _PRICES}
            line = {"provider": price.provider, "model": price.model, **figures}
            click.echo(json.dumps({**line, "as_of": str(price.as_of), "source": price.source}))
        return
    sources = any(price.source != "shipped" for price in entries)
    shown = Table(title="LLM prices, US dollars per million tokens", box=box.SIMPLE_HEAD)
    for column in ("provider", "model", *_HEADERS, "as of", *(["from"] if sources else [])):
        numeric = column in _HEADERS
        shown.add_column(column, justify="right" if numeric else "left", overflow="fold")
    for price in entries:
        shown.add_row(
            safe_text(price.provider),
            safe_text(price.model),
            *(dollars_json(getattr(price, k)) or "" for k in _PRICES),
            str(price.as_of),
            *([safe_text(price.source)] if sources else []),
        )
    safe_console().print(shown)


_PRICES = ("input", "cached_input", "cache_write", "output")
_HEADERS = ("input", "cached", "cache write", "output")
