"""Payload compression: the step between a body's Avro bytes and its sealing.

A payload is compressed before it is sealed (ciphertext does not compress) and the
envelope's ``payload_encoding`` names the compression right after the body format, so
every payload says how it opens, and payloads written before compression existed (or
with it turned off) open as they always did:

====================================  ===========================================
``avro``                              plain Avro
``avro+zstd-d1``                      zstd with the shared dictionary 1
``avro+zstd``                         zstd without a dictionary
``avro+deflate``                      zlib's deflate
``avro+zstd-d1+aes256gcm+aad2``       compressed, then sealed (the sealer's part
                                      follows the compression's)
``avro+zstd-d1+pad1+aes256gcm+aad2``  compressed, padded to a size bucket, sealed
                                      (:mod:`~agent_blackbox.schemas._padding`)
====================================  ===========================================

The shared dictionary ships with the package (``dictionaries/payload-d1.zdict``) and
never changes: a new one gets a new number, and a release keeps every number it ever
wrote. It was trained on the Avro bodies of synthetic agent runs (LLM calls in the
OpenAI and Anthropic shapes, tool calls, retrievals), so it knows the JSON keys and the
Avro framing every body repeats; that is what makes a small body worth compressing.

A body is stored compressed only when it is at least :data:`MIN_COMPRESSED_BYTES` long
and compression makes it smaller; otherwise it is stored as it was, under its plain
encoding. Opening refuses a frame that would inflate past the pipeline's limit (the
largest body the store accepts), so a forged payload cannot exhaust a reader's memory.

zstd comes from the ``zstandard`` binding of the reference library; deflate is the
standard library's ``zlib``. Neither is written here.
"""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Final, Literal

import zstandard

from agent_blackbox.schemas._errors import UndecodableMessage
from agent_blackbox.schemas._padding import PADDING, unpad

Compression = Literal["zstd", "zstd-nodict", "deflate", "none"]
"""What a pipeline compresses with (``Settings.payload_compression``): ``zstd`` uses
the shared dictionary."""

COMPRESSIONS: Final = ("zstd", "zstd-nodict", "deflate", "none")

MIN_COMPRESSED_BYTES = 64
"""Bodies shorter than this are stored uncompressed: a few bytes of framing would eat
what compression saves."""

ZSTD_LEVEL = 3
"""zstd's default level: within a few per cent of the best ratio on JSON bodies at a
fraction of the higher levels' time (the recorder compresses on the agent's path)."""

DEFLATE_LEVEL = 6

DICTIONARY_ID = 1
"""The shared dictionary new payloads are compressed with."""

_SCHEMES: Final = {"zstd": f"zstd-d{DICTIONARY_ID}", "zstd-nodict": "zstd", "deflate": "deflate"}
"""Compression setting → the scheme it writes into ``payload_encoding``."""

_DICTIONARY_FILES: Final = {1: "payload-d1.zdict"}
"""Every shared dictionary a payload may name, by number. Never remove one."""


def compression_scheme(compression: str) -> str | None:
    """The ``payload_encoding`` scheme of a compression setting (None for ``none``).

    Raises:
        ValueError: ``compression`` is not one of :data:`COMPRESSIONS`.
    """
    if compression == "none":
        return None
    scheme = _SCHEMES.get(compression)
    if scheme is None:
        raise ValueError(
            f"payload compression {compression!r} is not one of {', '.join(COMPRESSIONS)} "
            "(set BLACKBOX_PAYLOAD_COMPRESSION to one of them)"
        )
    return scheme


def with_compression(encoding: str, scheme: str) -> str:
    """``encoding`` (a sealer's: ``avro`` or ``avro+<seal>``) with ``scheme`` after the
    body format."""
    body, _, rest = encoding.partition("+")
    return f"{body}+{scheme}+{rest}" if rest else f"{body}+{scheme}"


# Every event's encoding is split three times on its way (the sealed-run guard, its
# refusal check, the opening), and a log holds a handful of encodings.
@lru_cache(maxsize=256)
def split_encoding(encoding: str) -> tuple[str | None, str]:
    """The compression scheme of ``encoding`` (None when uncompressed; with its padding
    step when padded: ``zstd-d1+pad1``) and the encoding the sealer sees (``encoding``
    without them)."""
    body, _, rest = encoding.partition("+")
    scheme, _, seal = rest.partition("+")
    if scheme == "deflate" or scheme == "zstd" or scheme.startswith("zstd-d"):
        padding, _, after = seal.partition("+")
        if padding == PADDING:
            scheme, seal = f"{scheme}+{PADDING}", after
        return scheme, f"{body}+{seal}" if seal else body
    return None, encoding


class Compressor:
    """Compresses Avro bodies with one setting, from any number of threads.

    zstd contexts are not safe to share between threads: each thread gets its own.
    """

    def __init__(self, compression: str) -> None:
        self.scheme = compression_scheme(compression)
        self._local = threading.local()

    def compress(self, data: bytes) -> bytes | None:
        """``data`` compressed, or None when it is stored as it is (too short, or not
        smaller compressed)."""
        scheme = self.scheme
        if scheme is None or len(data) < MIN_COMPRESSED_BYTES:
            return None
        if scheme == "deflate":
            packed = zlib.compress(data, DEFLATE_LEVEL)
        else:
            packed = self._zstd().compress(data)
        return packed if len(packed) < len(data) else None

    def _zstd(self) -> zstandard.ZstdCompressor:
        context: zstandard.ZstdCompressor | None = getattr(self._local, "zstd", None)
        if context is None:
            dictionary = None if self.scheme == "zstd" else _dictionary(DICTIONARY_ID)
            context = zstandard.ZstdCompressor(
                level=ZSTD_LEVEL, dict_data=dictionary, write_content_size=True
            )
            self._local.zstd = context
        return context


@dataclass(frozen=True, slots=True)
class Inflater:
    """Opens compressed payloads, refusing any that would inflate past ``limit`` bytes."""

    limit: int

    def inflate(self, scheme: str, data: bytes, where: str) -> bytes:
        """The Avro bytes of a payload compressed as ``scheme``.

        Raises:
            UndecodableMessage: an unknown compression or dictionary, a corrupt frame,
                or one that inflates past the limit; ``where`` names the event.
        """
        base, _, padding = scheme.partition("+")
        if padding:
            if padding != PADDING:
                raise UndecodableMessage(f"{where}: unknown payload padding {padding!r}")
            data, scheme = unpad(data, where), base
        if scheme == "deflate":
            return self._deflated(data, where)
        if scheme == "zstd":
            dictionary = None
        elif scheme.startswith("zstd-d") and scheme[6:].isdecimal():
            number = int(scheme[6:])
            if number not in _DICTIONARY_FILES:
                raise UndecodableMessage(
                    f"{where}: the payload is compressed with shared dictionary {number}, "
                    "which this release does not have; read it with a newer release"
                )
            dictionary = _dictionary(number)
        else:
            raise UndecodableMessage(f"{where}: unknown payload compression {scheme!r}")
        return self._zstd(data, dictionary, where)

    def _zstd(
        self, data: bytes, dictionary: zstandard.ZstdCompressionDict | None, where: str
    ) -> bytes:
        try:
            size = zstandard.frame_content_size(data)
        except zstandard.ZstdError as exc:
            raise UndecodableMessage(f"{where}: the zstd payload is corrupt ({exc})") from None
        if size < 0:  # every frame this project writes says its size
            raise UndecodableMessage(
                f"{where}: the zstd payload does not say how large it inflates; refused unread"
            )
        if size > self.limit:
            raise UndecodableMessage(
                f"{where}: the zstd payload would inflate to {size} bytes, over the "
                f"{self.limit}-byte limit of a body; refused unread"
            )
        try:
            return _decompressor(dictionary).decompress(data)
        except zstandard.ZstdError as exc:
            raise UndecodableMessage(f"{where}: the zstd payload is corrupt ({exc})") from None

    def _deflated(self, data: bytes, where: str) -> bytes:
        inflater = zlib.decompressobj()
        try:
            plain = inflater.decompress(data, self.limit + 1)
        except zlib.error as exc:
            raise UndecodableMessage(f"{where}: the deflate payload is corrupt ({exc})") from None
        if len(plain) > self.limit:
            raise UndecodableMessage(
                f"{where}: the deflate payload inflates past the {self.limit}-byte limit "
                "of a body; refused unread"
            )
        if not inflater.eof or inflater.unused_data:
            raise UndecodableMessage(f"{where}: the deflate payload is truncated or padded")
        return plain


@cache
def _dictionary(number: int) -> zstandard.ZstdCompressionDict:
    """Shared dictionary ``number``, read from the package once."""
    data = resources.files("agent_blackbox.schemas").joinpath(
        "dictionaries", _DICTIONARY_FILES[number]
    )
    return zstandard.ZstdCompressionDict(data.read_bytes())


_decompressors = threading.local()


def _decompressor(dictionary: zstandard.ZstdCompressionDict | None) -> zstandard.ZstdDecompressor:
    """This thread's decompression context for ``dictionary``."""
    contexts: dict[int, zstandard.ZstdDecompressor] | None = getattr(
        _decompressors, "contexts", None
    )
    if contexts is None:
        contexts = _decompressors.contexts = {}
    key = 0 if dictionary is None else dictionary.dict_id()
    context = contexts.get(key)
    if context is None:
        context = contexts[key] = zstandard.ZstdDecompressor(dict_data=dictionary)
    return context
