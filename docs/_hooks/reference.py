"""MkDocs hook: the generated parts of the reference.

A page asks for one with a marker line of its own, ``<!-- generated: NAME -->``:

- ``settings``: one row per field of :class:`agent_blackbox.schemas.Settings`, its
  variable, default and docstring (a field without a docstring is a build warning, so
  ``--strict`` fails on it);
- ``event-schemas``: every ``.avsc`` file the package ships, a section per event type
  and a table per body version.

An unknown marker is a warning too. Nothing here is part of the package.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import logging
import re
from collections.abc import Callable
from importlib import resources
from typing import Any

log = logging.getLogger("mkdocs.plugins.blackbox_reference")

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace each marker by what it names."""
    return MARKER.sub(lambda match: _generate(match.group(1)), markdown)


def _generate(name: str) -> str:
    generator = GENERATORS.get(name)
    if generator is None:
        log.warning("unknown generated section %r (known: %s)", name, ", ".join(GENERATORS))
        return ""
    return generator()


# Settings ---------------------------------------------------------------------------


def settings_table() -> str:
    """The Settings fields as a Markdown table."""
    from agent_blackbox.schemas import Settings

    docs = field_docstrings(Settings)
    rows = ["| variable | default | what it sets |", "|---|---|---|"]
    for field in dataclasses.fields(Settings):
        doc = docs.get(field.name)
        if not doc:
            log.warning("Settings.%s has no docstring for the settings reference", field.name)
            doc = ""
        default = field.default
        shown = "unset" if default is None or default == "" else f"`{default}`"
        text = " ".join(doc.split()).replace("|", "\\|")
        rows.append(f"| `BLACKBOX_{field.name.upper()}` | {shown} | {text} |")
    return "\n".join(rows) + "\n"


def field_docstrings(cls: type) -> dict[str, str]:
    """Attribute docstrings (a string right under a field) of a dataclass, by field."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    found: dict[str, str] = {}
    for node, after in zip(body, [*body[1:], None], strict=True):
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        if (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[node.target.id] = inspect.cleandoc(after.value.value)
    return found


# Event schemas ----------------------------------------------------------------------

_AVSC = re.compile(r"^(?P<type>.+)\.v(?P<version>\d+)\.avsc$")


def event_schemas() -> str:
    """A section per event type (the envelope first), a table per version."""
    folder = resources.files("agent_blackbox.schemas.avsc")
    schemas: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for entry in folder.iterdir():
        match = _AVSC.match(entry.name)
        if match is None:
            continue
        schema = json.loads(entry.read_text(encoding="utf-8"))
        schemas.setdefault(match["type"], []).append((int(match["version"]), schema))
    order = sorted(schemas, key=lambda name: (name != "envelope", name))
    parts: list[str] = []
    for name in order:
        title = "The envelope" if name == "envelope" else f"`{name}`"
        parts.append(f"## {title}\n")
        for version, schema in sorted(schemas[name], key=lambda item: item[0]):
            parts.append(_schema_section(name, version, schema))
    return "\n".join(parts)


def _schema_section(name: str, version: int, schema: dict[str, Any]) -> str:
    lines = [f"### {name} v{version}\n", f"`{name}.v{version}.avsc`, record `{schema['name']}`."]
    if schema.get("doc"):
        lines.append(f" {schema['doc']}")
    lines += ["\n", "| field | type | default | meaning |", "|---|---|---|---|"]
    for field in schema.get("fields", []):
        default = f"`{json.dumps(field['default'])}`" if "default" in field else ""
        doc = " ".join(str(field.get("doc", "")).split()).replace("|", "\\|")
        aliases = field.get("aliases")
        if aliases:
            doc = f"{doc} (formerly {', '.join(f'`{a}`' for a in aliases)})".strip()
        lines.append(f"| `{field['name']}` | {_type(field['type'])} | {default} | {doc} |")
    return "\n".join(lines) + "\n"


def _type(avro: Any) -> str:
    """An Avro type in a few words: ``string``, ``null or string``, ``array of string``."""
    return _words(avro).replace("|", "\\|")


def _words(avro: Any) -> str:
    if isinstance(avro, str):
        return avro
    if isinstance(avro, list):
        return " or ".join(_words(member) for member in avro)
    kind = avro.get("type")
    if avro.get("logicalType"):
        return f"{kind} ({avro['logicalType']})"
    if kind == "array":
        return f"array of {_words(avro['items'])}"
    if kind == "map":
        return f"map of {_words(avro['values'])}"
    if kind == "enum":
        return "enum " + ", ".join(avro.get("symbols", []))
    if kind == "record":
        inner = ", ".join(f"{f['name']}: {_words(f['type'])}" for f in avro.get("fields", []))
        return f"record {avro.get('name', '')} {{{inner}}}"
    return str(kind)


GENERATORS: dict[str, Callable[[], str]] = {
    "settings": settings_table,
    "event-schemas": event_schemas,
}
