"""When is a replayed agent's request "the same request" as the journaled one?

The relay compares the ``n``-th request of a restarted agent with the ``n``-th
of the journal by a digest over three things (``docs/opaque-agents.md``):

- the **method**, upper-cased;
- the **route**: the path under the relay's identity prefix (``/v1/chat/completions``,
  ``/tools/counter/add``) and the query string with its parameters sorted;
- the **body**: a JSON body is decoded and encoded again canonically (object keys
  sorted at every level, no insignificant whitespace, strings as UTF-8 without
  escapes, numbers in their shortest form), so two serialisations of the same value
  are the same request; any other body is taken byte for byte; an empty body is empty.

Nothing is dropped from a body: not ``stream`` (a streamed answer cannot be replayed to a
caller that asked for a plain one), not ``user``, not sampling parameters. An agent that
sends a timestamp, a random id or a nonce in its requests is not replayable, and the digest
says so at its first such request; that is the point. Headers are not part of it: clients
vary them (SDK versions, retry counters, trace ids) without changing what is asked.
"""

from __future__ import annotations

import hashlib
from urllib.parse import parse_qsl, urlencode

import msgspec

__all__ = ["canonical_body", "normalised_route", "request_digest"]

_encoder = msgspec.json.Encoder(order="sorted")


def canonical_body(body: bytes, content_type: str = "") -> bytes:
    """The body the digest is taken over: canonical JSON for a JSON body, else the bytes as sent."""
    if not body:
        return b""
    if "json" in content_type.lower() or not content_type:
        try:
            return _encoder.encode(msgspec.json.decode(body))
        except (msgspec.DecodeError, RecursionError):
            return body  # not JSON after all: byte for byte
    return body


def normalised_route(path: str, query: str = "") -> str:
    """The path and its query parameters in sorted order (``a=1&b=2`` and ``b=2&a=1`` are one route)."""
    pairs = sorted(parse_qsl(query, keep_blank_values=True))
    return f"{path}?{urlencode(pairs)}" if pairs else path


def request_digest(method: str, route: str, body: bytes, content_type: str = "") -> str:
    """The digest a journaled request and its replay must share (blake2b-256, hex)."""
    h = hashlib.blake2b(digest_size=32)
    h.update(method.upper().encode())
    h.update(b"\n")
    h.update(route.encode())
    h.update(b"\n")
    h.update(canonical_body(body, content_type))
    return h.hexdigest()
