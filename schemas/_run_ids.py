"""Run ids: the one rule every new run's id must meet.

A run id is chosen by the agent (or is a fresh UUID) and then travels everywhere: the
Kafka message key, file names of exports, terminal tables, the console's URLs. It is
restricted when a run is recorded to 1 to 128 characters of ``A-Z a-z 0-9 _ . : -``,
starting with a letter or a digit, so an id never carries markup (``"><script>``), a path
(``../../etc/passwd``, ``/``), a URL's own syntax (``?``, ``#``, ``%``), white space,
control or look-alike characters, and never reads as a relative path (``..``) or a
command-line option (``-x``). Readers still escape and quote every id they show: runs
recorded before the rule, or messages forged on the topic, may carry any text.
"""

from __future__ import annotations

import re

from agent_blackbox.schemas._errors import BlackboxError

MAX_RUN_ID = 128
"""The longest run id (characters)."""
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
"""The run id rule; match a whole id with ``fullmatch``."""
RUN_ID_RULE = (
    f"1 to {MAX_RUN_ID} characters of A-Z a-z 0-9 _ . : - starting with a letter or a digit"
)
"""The rule in words, for error messages and docs."""


class InvalidRunId(BlackboxError, ValueError):
    """A run id that breaks :data:`RUN_ID_RULE`; the message names the id and the rule."""


def is_run_id(value: object) -> bool:
    """Whether ``value`` is a string that meets the run id rule."""
    return isinstance(value, str) and RUN_ID_PATTERN.fullmatch(value) is not None


def check_run_id(value: object) -> str:
    """``value`` once it meets the run id rule.

    Raises:
        InvalidRunId: naming the id (escaped, cut at 80 characters) and the rule.
    """
    if is_run_id(value):
        return str(value)
    shown = type(value).__name__
    if isinstance(value, str):
        shown = (
            repr(value)
            if len(repr(value)) <= 80
            else f"{repr(value)[:79]}… ({len(value)} characters)"
        )
    raise InvalidRunId(
        f"run id {shown} is refused: a run id is {RUN_ID_RULE}; nothing was recorded. "
        "Leave run_id out for a fresh UUID, or build the id from those characters only"
    )
