"""The relay's logger, shared by its parts: every line keeps the one name (``blackbox.relay``)
that operators filter on, and errors are quoted the same way everywhere."""

from __future__ import annotations

import logging

log = logging.getLogger("blackbox.relay")


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (a driver's error goes on with SQL and links),
    or its type's name when it has no message."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
