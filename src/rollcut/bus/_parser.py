"""A NATS protocol parser whose message path costs a few byte operations.

Why: reading the history back is the read path's whole job (replay, the ledger's rebuild,
validation), and nats-py's parser tries two regular expressions on every message's control line,
copies each payload twice and trims its buffer once per message: a third of a ledger rebuild's
time went there before a single event was decoded. This parser reads ``MSG`` and ``HMSG`` by
splitting the control line, takes each payload with one copy, trims the buffer once per read,
and hands a page reader's messages (``raw_handlers``, see ``_stream._Client``) over without a
coroutine per message.

Everything else the server sends (``INFO``, ``PING``, ``PONG``, ``+OK``, ``-ERR``, and a
control line it cannot read) goes to nats-py's own parser, which then goes on to the end of what
was read: rare, and exactly nats-py's behaviour. The contract relied on is nats-py's
``Parser`` (``buf``, ``state``, ``reset``, ``parse``) and ``Client._process_msg``; a client
whose ``_ps`` is not this parser reads the same, slower (``tests/bus/test_parser.py`` compares
both on the same bytes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nats.errors import ProtocolError
from nats.protocol.parser import AWAITING_CONTROL_LINE, MAX_CONTROL_LINE_SIZE, Parser

__all__ = ["FastParser"]

_CRLF = b"\r\n"


class FastParser(Parser):
    """nats-py's parser with a fast path for messages; see the module's docstring."""

    def __init__(self, nc: Any, raw_handlers: dict[int, Callable[[bytes, bytes], None]]) -> None:
        super().__init__(nc)
        self._raw = raw_handlers

    async def parse(self, data: bytes = b"") -> None:
        if self.state != AWAITING_CONTROL_LINE:  # nats-py's parser is mid-message: let it finish
            await super().parse(data)
            return
        buf = bytes(self.buf) + data if self.buf else data
        self.buf = bytearray()
        pos, end = 0, len(buf)
        raw, nc = self._raw, self.nc
        try:
            while pos < end:
                eol = buf.find(_CRLF, pos, pos + MAX_CONTROL_LINE_SIZE)
                if eol < 0:
                    break  # the rest of the line is on its way (nats-py waits for a line too long too)
                op = 4 if buf.startswith(b"MSG ", pos) else 5 if buf.startswith(b"HMSG ", pos) else 0
                if not op:
                    # INFO, PING, PONG, +OK, -ERR, or a line nobody can read: that one line to nats-py
                    self.buf = bytearray(buf[pos : eol + 2])
                    pos = eol + 2
                    await super().parse()
                    if self.state != AWAITING_CONTROL_LINE:  # it read the line as a message's
                        self.buf.extend(buf[pos:])
                        pos = end
                        await super().parse()
                    continue
                subject, sid, reply, hsize, total = _control_line(buf[pos + op : eol], op == 4)
                body = eol + 2
                if body + total + 2 > end:
                    break  # the payload is on its way: its control line is read again then
                pos = body + total + 2
                handler = raw.get(sid)
                if handler is not None:
                    handler(buf[body : body + hsize], buf[body + hsize : body + total])
                else:
                    headers = buf[body : body + hsize] if hsize else None
                    await nc._process_msg(sid, subject, reply, buf[body + hsize : body + total], headers)
        finally:
            if pos < end:  # what is not parsed yet waits for the next read
                self.buf = bytearray(buf[pos:])


def _control_line(line: bytes, plain: bool) -> tuple[bytes, int, bytes, int, int]:
    """``subject sid [reply] [hsize] total`` of a ``MSG`` or ``HMSG`` line."""
    args = line.split()
    try:
        if plain and len(args) in (3, 4):
            total = int(args[-1])
            if total >= 0:
                return args[0], int(args[1]), args[2] if len(args) == 4 else b"", 0, total
        if not plain and len(args) in (4, 5):
            hsize, total = int(args[-2]), int(args[-1])
            if 0 <= hsize <= total:
                return args[0], int(args[1]), args[2] if len(args) == 5 else b"", hsize, total
    except ValueError:
        pass
    raise ProtocolError("nats: malformed MSG")
