"""rollcut's protocol parser reads what nats-py's reads, however the bytes arrive.

The fast parser (``bus/_parser.py``) replaces nats-py's on every rollcut connection; these
tests feed both the same server output, cut into reads at arbitrary places, and compare what
each hands to the client: messages in order with their subject, sid, reply, headers and payload,
and every other operation (``PING``, ``PONG``, ``INFO``, ``-ERR``) at its place between them.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.errors import ProtocolError
from nats.protocol.parser import Parser

from rollcut.bus._parser import FastParser


class _Recorder:
    """Stands in for the client: records what a parser hands over (no network involved)."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: Any) -> None:
        self.seen.append(("msg", sid, bytes(subject), bytes(reply), bytes(data), headers and bytes(headers)))

    async def _process_ping(self) -> None:
        self.seen.append(("ping",))

    async def _process_pong(self) -> None:
        self.seen.append(("pong",))

    async def _process_info(self, info: dict[str, Any]) -> None:
        self.seen.append(("info", json.dumps(info, sort_keys=True)))

    async def _process_err(self, err: str) -> None:
        self.seen.append(("err", err))


def _msg(subject: str, sid: int, reply: str, payload: bytes, headers: bytes | None) -> bytes:
    r = f" {reply}" if reply else ""
    if headers is None:
        return f"MSG {subject} {sid}{r} {len(payload)}\r\n".encode() + payload + b"\r\n"
    hdr = b"NATS/1.0\r\n" + headers + b"\r\n"
    line = f"HMSG {subject} {sid}{r} {len(hdr)} {len(hdr) + len(payload)}\r\n"
    return line.encode() + hdr + payload + b"\r\n"


_subjects = st.from_regex(r"[a-z][a-z0-9.]{0,20}[a-z0-9]", fullmatch=True)
_ops = st.one_of(
    st.builds(
        _msg,
        _subjects,
        st.integers(1, 10_000),
        st.one_of(st.just(""), _subjects),
        st.binary(max_size=300),
        st.one_of(st.none(), st.just(b""), st.just(b"Nats-Sequence: 7\r\nNats-Subject: a.b\r\n")),
    ),
    st.just(b"PING\r\n"),
    st.just(b"PONG\r\n"),
    st.just(b"+OK\r\n"),
    st.just(b'INFO {"server_id":"x","max_payload":1048576}\r\n'),
    st.just(b"-ERR 'Permissions Violation for Publish to a.b'\r\n"),
)


async def _feed(parser: Parser, wire: bytes, cuts: list[int]) -> None:
    last = 0
    for cut in [*sorted(set(cuts)), len(wire)]:
        await parser.parse(wire[last:cut])
        last = cut


def _both(wire: bytes, cuts: list[int], raw: dict[int, Any] | None = None) -> tuple[list[Any], list[Any]]:
    theirs, ours = _Recorder(), _Recorder()
    asyncio.run(_feed(Parser(theirs), wire, cuts))
    asyncio.run(_feed(FastParser(ours, raw or {}), wire, cuts))
    return theirs.seen, ours.seen


@settings(max_examples=300, deadline=None)
@given(st.lists(_ops, max_size=30), st.data())
def test_reads_what_nats_py_reads_however_the_bytes_are_cut(ops: list[bytes], data: st.DataObject) -> None:
    wire = b"".join(ops)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=12))
    theirs, ours = _both(wire, cuts)
    assert ours == theirs
    assert len(ours) == sum(1 for op in ops if op != b"+OK\r\n")


def test_a_page_reader_gets_its_messages_raw_and_in_order() -> None:
    got: list[tuple[bytes, bytes]] = []
    wire = b"".join(
        [
            _msg("_INBOX.a", 3, "", b"one", b"Nats-Sequence: 1\r\n"),
            _msg("other", 4, "", b"elsewhere", None),
            b"PING\r\n",
            _msg("_INBOX.a", 3, "", b"two", b"Nats-Sequence: 2\r\n"),
        ]
    )
    theirs, ours = _both(wire, [5, 40, 41], raw={3: lambda h, d: got.append((h, d))})
    assert got == [
        (b"NATS/1.0\r\nNats-Sequence: 1\r\n\r\n", b"one"),
        (b"NATS/1.0\r\nNats-Sequence: 2\r\n\r\n", b"two"),
    ]
    assert ours == [("msg", 4, b"other", b"", b"elsewhere", None), ("ping",)]
    assert [op[0] for op in theirs] == ["msg", "msg", "ping", "msg"]


@pytest.mark.parametrize(
    "line",
    [
        b"HMSG a 1 20 10\r\n",  # headers longer than the whole message
        b"MSG a x 3\r\n",  # a sid that is not a number
        b"MSG a 1 -3\r\n",  # a negative size
        b"HMSG a 1\r\n",  # too few arguments
    ],
)
def test_a_malformed_control_line_is_a_protocol_error(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        asyncio.run(FastParser(_Recorder(), {}).parse(line + b"abc\r\n"))


def test_an_unknown_operation_is_refused_as_nats_py_refuses_it() -> None:
    for parser in (Parser(_Recorder()), FastParser(_Recorder(), {})):
        with pytest.raises(ProtocolError):
            asyncio.run(parser.parse(b"BOGUS 1 2\r\n"))
