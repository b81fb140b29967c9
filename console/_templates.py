"""The console's templates and the filters they show values with: every value from a
payload is autoescaped, and its hidden characters (terminal escapes, bidi controls,
invisible characters) are shown as visible escapes."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from functools import lru_cache
from importlib import resources
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape

from agent_blackbox.console._charts import CHART_HEIGHT, CHART_WIDTH, MARGIN_LEFT, MARGIN_TOP
from agent_blackbox.console._tree import Span, tree_rows
from agent_blackbox.consumers import dollars_text
from agent_blackbox.schemas import visible_text

_LINE_BREAK = re.compile(r"\r\n|\n|\r")


def page_templates() -> Environment:
    """The console's templates, autoescaped, with the filters its pages use."""
    templates = Environment(
        loader=FileSystemLoader(str(resources.files("agent_blackbox.console") / "templates")),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    templates.filters["shown"] = visible_text
    templates.filters["shown_json"] = shown_json
    templates.filters["pretty"] = pretty
    templates.filters["shown_lines"] = shown_lines
    templates.filters["run_path"] = run_path
    # Jinja's own urlencode leaves "/" as it is, so an id such as "../runs/<other>" made
    # a link to another page: every value put in a link is quoted whole by this one.
    templates.filters["urlencode"] = url_quoted
    templates.filters["attributes_line"] = attributes_line
    templates.filters["when"] = when
    templates.filters["ms"] = ms
    templates.filters["dollars"] = dollars
    templates.filters["shorter"] = shorter
    templates.filters["tree_html"] = tree_html
    templates.globals.update(
        chart_width=CHART_WIDTH,
        chart_height=CHART_HEIGHT,
        margin_left=MARGIN_LEFT,
        margin_top=MARGIN_TOP,
    )
    return templates


def when(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def pretty(value: object) -> str:
    """A JSON value as indented text (a text value as the text itself)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def shown_json(text: str) -> str:
    """Pretty-printed JSON with its hidden characters made visible line by line: the
    line breaks are the layout's own (JSON strings never hold a raw one)."""
    return "\n".join(visible_text(line) for line in text.split("\n"))


def shown_lines(text: str) -> str:
    """A recorded text with its hidden characters made visible, its line breaks kept
    as line breaks (a message's paragraphs stay paragraphs)."""
    return "\n".join(visible_text(line) for line in _LINE_BREAK.split(text))


def run_path(run_id: str) -> Markup:
    """``/runs/<run id>``, quoted and escaped once for every link of a run page."""
    return escape(f"/runs/{quote(run_id, safe='')}")


def url_quoted(value: object) -> str:
    """``value`` quoted for a link: a mapping as a query string (``a=1&b=2``), anything
    else as one path segment or query value, every character but letters, digits and
    ``_ . - ~`` percent-encoded, ``/`` too, so an id never adds a segment to a path nor a
    parameter to a query."""
    if isinstance(value, Mapping):
        return urlencode({str(k): str(v) for k, v in value.items()})
    return quote(str(value), safe="")


def attributes_line(attributes: dict[str, str]) -> str:
    """An event's attributes on one line (``k=v``, each value cut to 80 characters and an
    ellipsis), hidden characters made visible: one string a row, however many."""
    return "  ".join(
        f"{visible_text(k)}={visible_text(v if len(v) <= 80 else v[:79] + '…')}"
        for k, v in sorted(attributes.items())
    )


def dollars(value: Decimal | None, unpriced: int = 0) -> str:
    """A cost as people read money, with the calls it leaves out: ``$0.0123``,
    ``$0.0123 + 2 unpriced``, ``2 unpriced``; empty when there is nothing to say."""
    shown = "" if value is None else dollars_text(value)
    if not unpriced:
        return shown
    return f"{shown} + {unpriced} unpriced" if shown else f"{unpriced} unpriced"


def shorter(value: str, most: int = 24) -> str:
    """A label (a session or user id, a keyed digest) shown whole when short, else its
    first characters and an ellipsis: a table cell never breaks it mid-word (the whole
    value is the element's title)."""
    shown = visible_text(value)
    return shown if len(shown) <= most else shown[: most - 1] + "…"


def ms(value: float | None) -> str:
    """A latency as people read it: ``0.42 ms``, ``12.3 ms``, ``840 ms``, ``2.41 s``."""
    if value is None:
        return ""
    if value < 1:
        return f"{value:.2f} ms"
    if value < 100:
        return f"{value:.1f} ms"
    return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.2f} s"


def tree_html(tree: Span, base: str) -> Markup:
    """A run's tree as nested lists (a ``<details>`` per span with children, its row
    the summary), each value escaped and its hidden characters made visible.

    Written here rather than in the template for the size of it: a run of 20,000 events
    is 20,000 rows, and a row written as one string costs a fraction of a template's
    dozen expressions per row.
    """
    out = []
    for row in tree_rows(tree):
        s = row.span
        name = _shown(s.name)
        if s.sequence:
            name = f'<a href="{base}/events/{s.sequence}">{name}</a>'
        status = f'<span class="bad">{_shown(s.error)}</span>' if s.error else _shown(s.detail)
        duration = ms(s.duration_ms) if s.timed else ""
        cells = (
            f'<span class="name">{name}</span><span class="kind">{_shown(s.kind)}</span>'
            f'<span class="dur">{duration}</span><span class="status">{status}</span>'
        )
        css = f"span k-{_shown(s.kind.lower())}" + (" failed" if s.error else "")
        ident = f' id="span-{s.sequence}"' if s.sequence else ""
        if s.children:
            out.append(
                f'<li class="{css}"{ident}><details open><summary class="row">{cells}</summary><ul>'
            )
        else:
            ends = "</ul></details></li>" * row.closes
            out.append(f'<li class="{css}"{ident}><div class="row">{cells}</div></li>{ends}')
    # Every value in it was escaped above (``base`` is the escaped run path).
    return Markup("\n".join(out))  # noqa: S704


@lru_cache(maxsize=4096)
def _shown(value: str) -> str:
    """``value`` escaped for HTML, its hidden characters made visible (remembered: a
    run's tree repeats its few names, kinds and details thousands of times)."""
    return str(escape(visible_text(value)))
