"""Run tags: short labels a run carries unsealed on its ``run.started`` envelope, so
analytics can group by them without a data key (``prompt_version=v2``, ``experiment=b``).

A tag is not content: it is visible to every reader of the views and of the topic, and
is checked here so that it stays a label (a short name, a short one-line value).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping

from agent_blackbox.schemas._errors import BlackboxError

TAG_PREFIX = "tag."
"""Prefix of a tag's attribute name on ``run.started``."""

MAX_TAGS = 16
MAX_TAG_VALUE = 128

PROMPT_VERSION_TAG = "prompt_version"
"""The tag the analytics views carry into every LLM call row (prompt A/B)."""

_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")


class InvalidTag(BlackboxError, ValueError):
    """A run tag that is not a short label; names the tag and what is wrong with it."""


def tag_problem(name: object, value: object) -> str | None:
    """What is wrong with the tag ``name=value``, or None when it is a usable label."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        return (
            f"tag name {name!r} is not a label: use 1-63 characters of a-z, 0-9 and _, "
            "starting with a letter"
        )
    if not isinstance(value, str):
        return f"tag {name}: the value must be a string, not {type(value).__name__}"
    if not value or len(value) > MAX_TAG_VALUE:
        return f"tag {name}: the value must be 1-{MAX_TAG_VALUE} characters, not {len(value)}"
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in value):
        return f"tag {name}: the value holds a control or format character"
    return None


def check_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """``tags`` as a plain dict once every tag is a usable label.

    Raises:
        InvalidTag: more than :data:`MAX_TAGS` tags, or one that :func:`tag_problem`
            finds fault with.
    """
    if len(tags) > MAX_TAGS:
        raise InvalidTag(f"a run carries at most {MAX_TAGS} tags, not {len(tags)}")
    for name, value in tags.items():
        if (problem := tag_problem(name, value)) is not None:
            raise InvalidTag(problem)
    return dict(tags)


def tag_attributes(tags: Mapping[str, str]) -> dict[str, str]:
    """The envelope attributes that carry ``tags``."""
    return {f"{TAG_PREFIX}{name}": value for name, value in sorted(tags.items())}


def run_tags(attributes: Mapping[str, str]) -> dict[str, str]:
    """The tags a ``run.started`` envelope's attributes carry (usable ones only: the
    topic is writable by others, so a reader checks again)."""
    tags = {}
    for key, value in attributes.items():
        if key.startswith(TAG_PREFIX):
            name = key[len(TAG_PREFIX) :]
            if tag_problem(name, value) is None:
                tags[name] = value
    return dict(sorted(tags.items())[:MAX_TAGS])
