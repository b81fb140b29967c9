"""Moments as people type them on a command line or in a form: a span back from now
(``30m``, ``6h``, ``2d``) or an ISO 8601 time."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, tzinfo

SPAN_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
"""The units of a span, in seconds."""

_SPAN = re.compile(r"([0-9]+)([a-z])")


def moment(raw: str, *, spans: str = "smhdw", naive: tzinfo | None = None) -> datetime:
    """``raw`` as a moment: a whole number and a unit of ``spans`` back from now, or an
    ISO 8601 time; an ISO time that names no zone is in ``naive`` (local time when None).

    Raises:
        ValueError: ``raw`` is neither, or its span reaches back before the year 1.
    """
    text = raw.strip()
    span = _SPAN.fullmatch(text)
    if span is not None and span[2] in spans:
        try:
            return datetime.now(UTC) - timedelta(seconds=int(span[1]) * SPAN_SECONDS[span[2]])
        except OverflowError:
            raise ValueError(f"{raw} reaches back before the year 1") from None
    at = datetime.fromisoformat(text)
    if at.tzinfo is not None:
        return at
    return at.astimezone() if naive is None else at.replace(tzinfo=naive)
