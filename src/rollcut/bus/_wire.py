"""Pre-framed publishes for the body of an atomic batch.

Why: nats-py's ``publish()`` re-validates the subject and every header key
and value with regexes on each call, which costs more CPU per message than
the rest of an append together. Inside a batch rollcut's subjects and header
values are built from already validated tokens and integers (no CR/LF can
occur), so the HPUB frames can be built with plain byte joins and handed to
the connection's write buffer in one call. The batch's commit message still
goes through the public ``request()``, so replies, inboxes and reconnect
buffering stay nats-py's business.

The one private entry point used, ``Client._send_command``, is checked once;
if a future nats-py drops it, :func:`send_frames` falls back to public
``publish()`` and rollcut only gets slower, never wrong.
"""

from __future__ import annotations

from nats.aio.client import Client as NATS

__all__ = ["encode_headers", "fast_path_available", "frame_hpub", "send_batch_body"]

_HDR_LINE = b"NATS/1.0\r\n"
_CRLF = b"\r\n"


def fast_path_available(nc: NATS) -> bool:
    return callable(getattr(nc, "_send_command", None))


def encode_headers(headers: dict[str, str]) -> bytes:
    """Header lines (without the NATS/1.0 line and the closing blank line)."""
    return "".join([f"{k}: {v}\r\n" for k, v in headers.items()]).encode()


def frame_hpub(subject: str, header_lines: bytes, payload: bytes) -> bytes:
    """One ``HPUB`` protocol frame without a reply subject."""
    hlen = len(_HDR_LINE) + len(header_lines) + 2
    return b"".join(
        (
            f"HPUB {subject} {hlen} {hlen + len(payload)}\r\n".encode(),
            _HDR_LINE,
            header_lines,
            _CRLF,
            payload,
            _CRLF,
        )
    )


async def send_batch_body(
    nc: NATS, batch_id: str, messages: list[tuple[str, dict[str, str], bytes, bytes]]
) -> None:
    """Queue the un-acked messages of an atomic batch, numbered from 1, in order.

    Each message is ``(subject, headers, header_lines, payload)`` where
    ``header_lines == encode_headers(headers)``: the fast path appends the
    batch headers to the pre-encoded lines, the fallback to the dict.
    """
    if not messages:
        return
    if fast_path_available(nc):
        frames = [
            frame_hpub(s, hl + f"Nats-Batch-Id: {batch_id}\r\nNats-Batch-Sequence: {i}\r\n".encode(), p)
            for i, (s, _, hl, p) in enumerate(messages, 1)
        ]
        await nc._send_command(b"".join(frames))
        return
    for i, (s, h, _, p) in enumerate(messages, 1):
        await nc.publish(s, p, headers={**h, "Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(i)})
