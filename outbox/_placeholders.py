"""What stands in for a redacted value: a typed placeholder, or a keyed pseudonym.

A placeholder names the rule that fired (``[redacted:email]``). A pseudonym
(``[email:9f3a1c04be7d]``) is stable: the same value gives the same one in every run of
a tenant, so code that compares redacted values for equality behaves in replay as it did
when recorded. Its tag is an HMAC under a key derived from the tenant's key in the key
store: an unkeyed hash of an e-mail address would be a dictionary attack away from the
address, so pseudonyms need a key store.
"""

from __future__ import annotations

import hashlib
import hmac

from agent_blackbox.outbox._errors import RedactionConfigError

PLACEHOLDER_PREFIX = "[redacted:"
CREDENTIAL = "credential"
"""The rule every credential is redacted under, whichever detector or key name found it."""


def placeholder(rule: str) -> str:
    """The string that stands in for what ``rule`` removed, e.g. ``[redacted:email]``."""
    return f"{PLACEHOLDER_PREFIX}{rule}]"


PSEUDONYMOUS = ("card_number", "email", "path", "phone")
"""The rules that may replace values by pseudonyms; never credentials."""


def _pseudonym_opening(rule: str) -> str:
    """What every pseudonym of ``rule`` begins with (``[email:``)."""
    return f"[{rule}:"


_OPENINGS = (PLACEHOLDER_PREFIX, *map(_pseudonym_opening, PSEUDONYMOUS))


def may_hold_stand_in(text: str) -> bool:
    """Whether ``text`` (a value's JSON) holds what a placeholder or a pseudonym opens
    with: a value without it was changed by no rule (every rule leaves one)."""
    return any(opening in text for opening in _OPENINGS)


PSEUDONYM_HEX = 12
"""Hex digits of a pseudonym's tag: 48 bits, so distinct values of one tenant collide
with odds near one in a million only past some 24,000 of them."""


def pseudonym(rule: str, value: str, key: bytes) -> str:
    """The stable placeholder of ``value`` found by ``rule``, keyed by ``key`` (the
    tenant's pseudonym key), e.g. ``[email:9f3a1c04be7d]``."""
    mac = hmac.new(key, f"{rule}\x00{value}".encode(), hashlib.sha256)
    return f"{_pseudonym_opening(rule)}{mac.hexdigest()[:PSEUDONYM_HEX]}]"


class StandIns:
    """Gives the stand-in of each value a rule removes.

    Args:
        pseudonyms: the rules whose values become pseudonyms; every other rule's values
            become its typed placeholder.
        key: the tenant's pseudonym key; None until the recorder knows the tenant, and
            then a pseudonym cannot be made (a placeholder still can).
    """

    __slots__ = ("_key", "_pseudonyms")

    def __init__(self, pseudonyms: frozenset[str], key: bytes | None = None) -> None:
        self._pseudonyms = pseudonyms
        self._key = key

    def pseudonymous(self, rule: str) -> bool:
        """Whether values removed by ``rule`` become pseudonyms."""
        return rule in self._pseudonyms

    def of(self, rule: str, value: str) -> str:
        """The placeholder of ``value``: typed, or the keyed pseudonym.

        Raises:
            RedactionConfigError: ``rule`` gives pseudonyms and no key was given.
        """
        if rule not in self._pseudonyms:
            return placeholder(rule)
        if self._key is None:
            raise RedactionConfigError(
                f"the redaction rules give pseudonyms for {rule!r}, and pseudonyms are keyed "
                "by the tenant's key: record with a key store (BLACKBOX_KEK_FILE) so the "
                "recorder can key them (an unkeyed hash of a value such as an e-mail "
                "address is a dictionary attack away from the value)"
            )
        return pseudonym(rule, value, self._key)
