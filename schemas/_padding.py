"""Padding compressed, sealed bodies to size buckets, so their sizes say less.

Compression before sealing makes a sealed body's size depend on its content: when an
attacker's text and a secret share a body, a guess that matches the secret compresses
better, and the sealed body comes out a byte or two shorter (a compression oracle,
as CRIME and BREACH showed for TLS and HTTP). Sealing hides the bytes, not the length.

A compressed body that is about to be sealed is therefore padded to the next size of a
fixed series of buckets, four to each doubling (64, 80, 96, 112, 128, 160, 192, 224,
256, ... bytes): a few bytes gained by a right guess no longer change the stored size,
except where the compressed size sits right at a bucket's edge. The padding is the
ISO/IEC 7816-4 kind: one ``0x80`` byte, then zeros, so it comes off without a length
field. A padded body names ``pad1`` after its compression in ``payload_encoding``
(``avro+zstd-d1+pad1+aes256gcm+aad2``); bodies without it open as before.

Padding narrows the oracle; it does not close it: an attacker who can both fill the
body to a bucket's edge and watch many bodies can still learn about a bit per body
(measured: 8 of 10 characters from some 12,600 bodies per character). A
tenant whose bodies hold secrets next to text others control should record them
uncompressed (``BLACKBOX_PAYLOAD_COMPRESSION_TENANTS=<tenant>=none``).
"""

from __future__ import annotations

from typing import Final

from agent_blackbox.schemas._errors import UndecodableMessage

PADDING: Final = "pad1"
"""The step ``payload_encoding`` names for this padding, after the compression."""

STEPS_PER_DOUBLING: Final = 4
"""Buckets between one power of two and the next: at most 25 % added to a body (about
10 % on average), a few bytes of guess lost in buckets 16 to tens of thousands wide."""

SMALLEST_BUCKET: Final = 64

_MARK: Final = 0x80


def bucket(length: int) -> int:
    """The padded size of ``length`` bytes: the smallest bucket that holds them and the
    padding's mark byte."""
    needed = length + 1
    if needed <= SMALLEST_BUCKET:
        return SMALLEST_BUCKET
    # With STEPS_PER_DOUBLING = 4, (needed >> shift) lies in 4..7: the bucket is the next
    # multiple of 2**shift.
    shift = needed.bit_length() - STEPS_PER_DOUBLING.bit_length()
    step = 1 << shift
    return -(-needed // step) * step


def pad(data: bytes) -> bytes:
    """``data``, the mark byte and zeros, :func:`bucket` bytes in all."""
    return data + bytes([_MARK]) + bytes(bucket(len(data)) - len(data) - 1)


def unpad(data: bytes, where: str) -> bytes:
    """``data`` without its padding.

    Raises:
        UndecodableMessage: it holds no mark byte where the padding should end;
            ``where`` names the event.
    """
    end = len(data.rstrip(b"\x00")) - 1
    if end < 0 or data[end] != _MARK:
        raise UndecodableMessage(f"{where}: the padded payload has no padding mark; refused")
    return data[:end]
