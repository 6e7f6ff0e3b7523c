"""Bytes on the wire: msgpack body, optional zstd, and a digest checked on read.

Frame layout (8 bytes of header, then the body)::

    0..1   b"rc"          magic, so a foreign message is named as such
    2      frame version  (1)
    3      flags          bit 0: body is zstd-compressed
    4..7   CRC-32         of the body exactly as stored (big-endian)

The checksum covers the stored (possibly compressed) bytes so that corruption
is caught before decompression, and a corrupt record is reported with its
stream sequence instead of being folded into session state. CRC-32 and not a
cryptographic digest: it guards against bit rot, truncation and bugs, as
Kafka's record CRC does; anyone able to write the stream could recompute any
unkeyed digest, and write access is what the server's credentials control.
It is also three times cheaper than blake2b on every read. The header lives
in the payload rather than in NATS headers because every reader path (direct
get, consumers, a copied file) carries the payload, and it keeps per-message
header parsing off the hot path.

Encoding validates against the strict mirror of the schema (ids checked
against their alphabet, see ``_strict.py``); decoding validates types,
lengths and ranges. Records of an older schema_version are upcast step by
step (eventsourcing-style) and then converted; records of a newer one are
refused.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Callable
from typing import Any

import msgspec
import zstandard

from .._errors import (
    CorruptEventError,
    EventTooLargeError,
    SchemaError,
    SchemaVersionError,
    UnknownEventKindError,
)
from ._events import SCHEMA_VERSION, AnyEvent, Event
from ._kinds import KINDS, kind_of
from ._strict import strict_union

_STRICT = strict_union(AnyEvent)

__all__ = ["DEFAULT_COMPRESS_THRESHOLD", "DEFAULT_MAX_EVENT_BYTES", "Codec", "Upcaster", "digest"]

_MAGIC = b"rc"
_FRAME_VERSION = 1
_FLAG_ZSTD = 0x01
_HEADER = 8
_LAYOUT = struct.Struct(">2sBBI")  # magic, frame version, flags, crc32 of the body: read in one call
DEFAULT_COMPRESS_THRESHOLD = 1024
# NATS' default max_payload is 1 MiB; leave room for headers.
DEFAULT_MAX_EVENT_BYTES = 1024 * 1024 - 4096

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
"""Turns a raw record of one schema version into the next."""


def _corrupt(reason: str, stream: str, seq: int, subject: str) -> CorruptEventError:
    return CorruptEventError(reason, stream=stream, seq=seq, subject=subject)


def digest(data: bytes) -> str:
    """Hex blake2b-128: content identity for rollout inputs and token receipts."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class Codec:
    """Encodes events to frames and back. Not shared across threads."""

    def __init__(
        self,
        *,
        compress_threshold: int = DEFAULT_COMPRESS_THRESHOLD,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        upcasters: dict[tuple[str, int], Upcaster] | None = None,
    ) -> None:
        self.compress_threshold = compress_threshold
        self.max_event_bytes = max_event_bytes
        self._upcasters = dict(upcasters or {})
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(AnyEvent)
        self._strict = msgspec.msgpack.Decoder(_STRICT)
        self._raw = msgspec.msgpack.Decoder()
        self._zc = zstandard.ZstdCompressor(level=3)
        self._zd = zstandard.ZstdDecompressor()

    # --- encode -------------------------------------------------------------

    def encode(self, event: Event) -> bytes:
        """Validate ``event`` against its schema and frame it.

        Struct construction in msgspec does not check constraints, so the body
        is decoded once more here, against the strict mirror types: a bad
        field is refused before anything is sent, with msgspec's message
        naming the field and the rule.
        """
        body = self._enc.encode(event)
        if len(body) > self.max_event_bytes:  # the decoded size: what every reader will hold
            raise EventTooLargeError(kind_of(type(event)), len(body), self.max_event_bytes)
        try:
            self._strict.decode(body)
        except msgspec.ValidationError as exc:
            raise SchemaError(f"{type(event).__name__}: {exc}") from exc
        flags = 0
        if len(body) > self.compress_threshold:
            packed = self._zc.compress(body)
            if len(packed) < len(body):
                body, flags = packed, _FLAG_ZSTD
        frame = _LAYOUT.pack(_MAGIC, _FRAME_VERSION, flags, zlib.crc32(body)) + body
        if len(frame) > self.max_event_bytes:
            raise EventTooLargeError(kind_of(type(event)), len(frame), self.max_event_bytes)
        return frame

    # --- decode -------------------------------------------------------------

    def decode(self, frame: bytes, *, stream: str = "", seq: int = 0, subject: str = "") -> Event:
        """Check the frame and decode it; every failure names where it happened."""
        if len(frame) < _HEADER:
            raise _corrupt("not a rollcut frame (bad magic or too short)", stream, seq, subject)
        magic, version, flags, crc = _LAYOUT.unpack_from(frame)
        if magic != _MAGIC:
            raise _corrupt("not a rollcut frame (bad magic or too short)", stream, seq, subject)
        if version != _FRAME_VERSION:
            raise _corrupt(f"frame version {version} is not {_FRAME_VERSION}", stream, seq, subject)
        body = frame[_HEADER:]  # a copy, but msgspec decodes bytes faster than a memoryview
        if zlib.crc32(body) != crc:
            raise _corrupt("payload checksum mismatch", stream, seq, subject)
        if flags & _FLAG_ZSTD:
            body = self._inflate(body, stream, seq, subject)
        elif len(body) > self.max_event_bytes:
            raise _corrupt(
                f"{len(body)} bytes, over the {self.max_event_bytes}-byte limit", stream, seq, subject
            )
        try:
            event = self._dec.decode(body)
        except msgspec.DecodeError as exc:
            return self._slow_decode(body, exc, stream, seq, subject)
        if event.schema_version != SCHEMA_VERSION:
            return self._slow_decode(body, None, stream, seq, subject)
        return event

    def _inflate(self, packed: bytes, stream: str, seq: int, subject: str) -> bytes:
        """Decompress at most ``max_event_bytes``, whatever the frame's header declares: a small
        frame that inflates to gigabytes is refused after the limit, never allocated.

        A frame that declares its size (rollcut's compressor always does) is inflated in one call
        into a buffer of exactly that size (four times cheaper than a stream); one that does not
        is read through a stream and counted.
        """
        limit = self.max_event_bytes
        try:
            declared = zstandard.frame_content_size(packed)
            if declared > limit:  # -1: not declared, read and count
                raise _corrupt(
                    f"zstd frame declares {declared} bytes, over the {limit}-byte limit", stream, seq, subject
                )
            if declared >= 0:
                body = self._zd.decompress(packed, max_output_size=declared)
                if len(body) != declared:
                    raise _corrupt(
                        f"zstd frame inflates to {len(body)} bytes, not the {declared} it declares",
                        stream,
                        seq,
                        subject,
                    )
                return body
            with self._zd.stream_reader(packed) as reader:
                body = reader.read(limit + 1)
        except zstandard.ZstdError as exc:
            raise _corrupt(f"zstd: {exc}", stream, seq, subject) from exc
        if len(body) > limit:
            raise _corrupt(f"zstd frame inflates past the {limit}-byte limit", stream, seq, subject)
        return body

    def _slow_decode(
        self, body: bytes, fast_exc: Exception | None, stream: str, seq: int, subject: str
    ) -> Event:
        """Explain a failure precisely, or upcast an older record."""
        try:
            raw = self._raw.decode(body)
        except msgspec.DecodeError as exc:
            raise _corrupt(f"msgpack: {exc}", stream, seq, subject) from exc
        if not isinstance(raw, dict):
            raise _corrupt("body is not a map", stream, seq, subject)
        kind = raw.get("kind")
        if kind not in KINDS:
            raise UnknownEventKindError(str(kind), list(KINDS))
        version = raw.get("schema_version")
        if not isinstance(version, int) or version < 0:
            raise SchemaError(f"{kind}: schema_version must be an int >= 0, got {version!r}")
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(f"{kind} event", version, SCHEMA_VERSION)
        while version < SCHEMA_VERSION:
            step = self._upcasters.get((kind, version))
            if step is None:
                raise SchemaError(f"{kind}: no upcaster from schema_version {version}")
            raw = step(raw)
            version += 1
            raw["schema_version"] = version
        try:
            event: Event = msgspec.convert(raw, AnyEvent)
            return event
        except msgspec.ValidationError as exc:
            raise SchemaError(f"{kind}: {exc}") from (fast_exc or exc)
