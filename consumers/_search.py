"""The run list's search: a query a person types, parsed into filters, and the SQL
those filters add to the list.

A query is words and ``name:value`` terms, separated by spaces; a value (or a phrase of
words) with spaces goes in double quotes::

    model:gpt-4o-mini tool:lookup status:failed "refund loop" tag:team=billing

Terms: ``run:`` (a run id prefix), ``tag:name=value`` (or ``tag:name``: has the tag),
``tool:``, ``model:``, ``error:`` (an error class), ``status:``, ``code:`` (code
version), ``prompt:`` (prompt version), ``session:``, ``user:``, ``agent:``. Words and
phrases are searched in the words of the runs' LLM messages (for the tenants that opted
in to full-text search). A query is parsed into values only: each reaches the database
as a bound parameter, never as SQL, and anything the parser cannot read is an error
that says what to write instead.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, Executable, text
from sqlalchemy.exc import OperationalError

from agent_blackbox.schemas import BlackboxError, hidden_characters

MAX_QUERY = 500
"""The longest query (characters) the parser reads."""
MAX_VALUE = 200
RUN_STATUSES = ("running", "succeeded", "failed", "abandoned", "finished")
SEARCH_TERMS = {
    "run": "run_prefix",
    "tag": "tags",
    "tool": "tool",
    "model": "model",
    "error": "error_class",
    "status": "status",
    "code": "code_version",
    "prompt": "prompt_version",
    "session": "session",
    "user": "user",
    "agent": "agent",
}
"""Each term a query may use, and the run list filter it sets."""
TEXT_SEARCH_CONFIG = "simple"
"""How message text is split into words: as written, lower-cased, no stemming (ids,
codes and words of any language are found as typed)."""
_RUN_PREFIX = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_TAG_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
_TOKEN = re.compile(r'\s*(?:([A-Za-z_]+):)?(?:"([^"]*)"|(\S+))')


class SearchError(BlackboxError, ValueError):
    """A search query that cannot be read; the message says what to write instead."""


@dataclass(frozen=True, slots=True)
class SearchTerms:
    """What a query asks for: run list filters, and words to find in messages."""

    filters: dict[str, Any]
    """Run list filter name → value (``tags``: a tuple of ``(name, value or None)``)."""
    words: str | None = None
    """The words and quoted phrases, for the full-text search (None: none given)."""


def parse_search(query: str) -> SearchTerms:
    """Read ``query`` (see the module).

    Raises:
        SearchError: a term the parser does not know, an unclosed quote, a value of the
            wrong form, a term given twice (but ``tag:``), control characters, or a
            query over :data:`MAX_QUERY` characters.
    """
    if len(query) > MAX_QUERY:
        raise SearchError(f"the search is {len(query)} characters long; keep it to {MAX_QUERY}")
    if hidden_characters().search(query):
        raise SearchError("the search holds a control or invisible character; type it again")
    if query.count('"') % 2:
        raise SearchError('a quote is not closed: put phrases and values with spaces in "..."')
    filters: dict[str, Any] = {}
    words: list[str] = []
    position = 0
    query = query.strip()
    while position < len(query):
        found = _TOKEN.match(query, position)
        if found is None:  # only a stray quote is left; counted above, so never
            raise SearchError(f"cannot read the search from {query[position:][:20]!r}")
        position = found.end()
        name, quoted, bare = found.groups()
        value = quoted if quoted is not None else bare
        if name is None and bare is not None and re.fullmatch(r"[A-Za-z_]+:", bare):
            _term(filters, bare[:-1].lower(), "")  # a term with no value: says so
        if name is None:
            if value.strip():
                words.append(f'"{value}"' if quoted is not None else value)
            continue
        _term(filters, name.lower(), value)
    return SearchTerms(filters, " ".join(words) or None)


def _term(filters: dict[str, Any], name: str, value: str) -> None:
    field = SEARCH_TERMS.get(name)
    if field is None:
        raise SearchError(
            f"{name}: is not a search term; use one of "
            f"{', '.join(t + ':' for t in SEARCH_TERMS)}, or put the words in quotes to find them"
        )
    value = value.strip()
    if not value:
        raise SearchError(f"{name}: needs a value (for example {name}:{_EXAMPLES[name]})")
    if len(value) > MAX_VALUE:
        raise SearchError(f"{name}: the value is longer than {MAX_VALUE} characters")
    if field == "tags":
        filters["tags"] = (*filters.get("tags", ()), _tag(value))
        return
    if field in filters:
        raise SearchError(f"{name}: is given twice; a run has one {name}, give it once")
    if field == "run_prefix" and not _RUN_PREFIX.fullmatch(value):
        raise SearchError(
            f"run:{value} is not the start of a run id (letters, digits, _ . : - only)"
        )
    if field == "status" and value not in RUN_STATUSES:
        raise SearchError(
            f"status:{value} is not a run status; use one of {', '.join(RUN_STATUSES)}"
        )
    filters[field] = value


def _tag(value: str) -> tuple[str, str | None]:
    name, _, tagged = value.partition("=")
    if not _TAG_NAME.fullmatch(name):
        raise SearchError(
            f"tag:{value}: a tag name is lower-case letters, digits and _ "
            "(tag:name=value, or tag:name for runs that have the tag)"
        )
    return (name, tagged if "=" in value else None)


_EXAMPLES = {
    "run": "3f2a9c",
    "tag": "team=billing",
    "tool": "lookup_order",
    "model": "gpt-4o-mini",
    "error": "TimeoutError",
    "status": "failed",
    "code": "v1.4.2",
    "prompt": "v2",
    "session": "chat-1841",
    "user": "u-42",
    "agent": "support-agent",
}


def with_search(where: Any, terms: SearchTerms) -> Any:
    """``where`` (a :class:`RunFilter`) narrowed by ``terms``: a term replaces the filter
    of the same name; tags add to its tags."""
    filters = dict(terms.filters)
    if "tags" in filters:
        filters["tags"] = (*where.tags, *filters["tags"])
    if terms.words is not None:
        filters["text"] = terms.words
    return replace(where, **filters)


def run_prefix_range(prefix: str) -> tuple[str, str]:
    """The run ids starting with ``prefix`` as a range in byte order: ``[low, high)``.

    A range, not ``LIKE``: it uses the run id index with a bound parameter, whatever
    plan the statement gets. Prefixes are ASCII (see :func:`parse_search`), so the
    next string in byte order is the last character's successor.
    """
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


def loose_words(words: str) -> str:
    """What every run holding a call that matches ``words`` (a full-text query) holds
    among all its words: the words without their phrases' order, and without the words
    ``-`` excludes (a run may have calls without them). Empty when it names no word."""
    kept = [w for w in words.replace('"', " ").split() if not w.startswith("-")]
    return " ".join(kept) if any(w.lower() != "or" for w in kept) else ""


BITMAP_TERMS = ("model", "tags", "tool", "error_class", "text")
"""The filters held in the rollups' GIN indexes (see :func:`walk_or_bitmaps`)."""


def bitmap_terms(where: Any) -> int:
    """How many of :data:`BITMAP_TERMS` ``where`` uses (each tag counts)."""
    return sum(
        len(where.tags) if name == "tags" else bool(getattr(where, name)) for name in BITMAP_TERMS
    )


WALK_BUDGET_MS = 50
"""How long a page of runs that GIN-held terms narrow may walk the runs newest first
before its terms' bitmaps are read (and intersected) instead."""


def walk_or_bitmaps(
    conn: Connection, walk: Executable, bitmaps: Executable, params: dict[str, Any]
) -> Sequence[Any]:
    """The rows of ``walk``, or of ``bitmaps`` when ``walk`` takes over
    :data:`WALK_BUDGET_MS`.

    Walking the runs newest first finds a page at once when the terms match many runs
    together, and walks them all when they seldom do: a rare tool, or two terms that
    seldom meet in one run (the planner cannot tell: it has no statistics of a value
    inside an array it does not keep, and takes two terms for independent). Reading
    the terms' bitmaps costs about the same either way: tens of milliseconds at a
    million runs, more when a term matches many runs. So the walk goes first, on a
    budget (a savepoint's statement timeout, put back after).
    """
    previous = conn.execute(text("SELECT current_setting('statement_timeout')")).scalar_one()
    try:
        with conn.begin_nested():
            conn.execute(_TIMEOUT, {"value": f"{WALK_BUDGET_MS}ms"})
            rows = conn.execute(walk, params).all()
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) != _CANCELED:
            raise
        return conn.execute(bitmaps, params).all()  # the savepoint took the timeout back
    conn.execute(_TIMEOUT, {"value": previous})
    return rows


_TIMEOUT = text("SELECT set_config('statement_timeout', :value, true)")
_CANCELED = "57014"
"""SQLSTATE query_canceled: the statement timeout fired."""


def search_clauses(where: Any, params: dict[str, Any], run: str, rollup: str) -> list[str]:
    """The SQL conditions of ``where``'s search filters (a :class:`RunFilter`), with
    their values put in ``params``; ``run`` and ``rollup`` are the aliases of the runs
    and the rollups tables in the statement."""
    clauses: list[str] = []
    for name, column in (("session", "session_id"), ("user", "user_id")):
        value = getattr(where, name)
        if value:
            clauses.append(f"{run}.{column} = :{name}")
            params[name] = value
    if where.run_prefix:
        params["run_low"], params["run_high"] = run_prefix_range(where.run_prefix)
        clauses.append(
            f'{run}.run_id COLLATE "C" >= :run_low AND {run}.run_id COLLATE "C" < :run_high'
        )
    for i, (tag, value) in enumerate(where.tags):
        if value is None:
            clauses.append(f"{rollup}.tags ? :tag_{i}")
            params[f"tag_{i}"] = tag
        else:
            clauses.append(
                f"{rollup}.tags @> "
                f"jsonb_build_object(CAST(:tag_{i} AS text), CAST(:tagv_{i} AS text))"
            )
            params[f"tag_{i}"], params[f"tagv_{i}"] = tag, value
    for name, column in (("tool", "tools"), ("error_class", "error_classes")):
        value = getattr(where, name)
        if value:
            clauses.append(f"{rollup}.{column} @> ARRAY[CAST(:{name} AS text)]")
            params[name] = value
    if where.text:
        # The run's words (no positions: a phrase is its words) narrow the runs through
        # one index with every other term; a call's own words then decide.
        loose = loose_words(where.text)
        if loose:
            clauses.append(
                f"{rollup}.words @@ websearch_to_tsquery('{TEXT_SEARCH_CONFIG}', :loose_words)"
            )
            params["loose_words"] = loose
        clauses.append(
            f"EXISTS (SELECT 1 FROM blackbox_views.message_text m WHERE m.run_id = {run}.run_id "
            f"AND m.words @@ websearch_to_tsquery('{TEXT_SEARCH_CONFIG}', :words))"
        )
        params["words"] = where.text
    return clauses
