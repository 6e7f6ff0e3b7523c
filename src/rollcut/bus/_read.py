"""Ordered reads up to a cut, by batched direct get.

Why direct get and not a consumer: a read up to a cut is a bounded scan of
history, not a subscription. A batched direct get (ADR-31) streams a page of
messages in answer to one request, creates no server-side consumer state, and
can be filtered by subject; pages continue from the last sequence seen until
the cut. A read with several filters (one rollout = its fence subject plus its
event subjects) runs one scan per filter and merges them by sequence.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from .._errors import BusError
from ._patience import Patience, gone_flag
from ._stream import parse_headers

__all__ = ["Confirm", "RawMessage", "scan", "scan_merged"]

DEFAULT_PAGE = 2048

Confirm = Callable[[int, "str | None"], Awaitable["int | None"]]
"""The next stored sequence at or after ``seq`` on a filter (None: the whole stream), as the stream's
leader sees it; None if there is none."""


class RawMessage(msgspec.Struct, frozen=True, gc=False):
    seq: int
    subject: str
    data: bytes


_DATA_LINE = b"NATS/1.0\r\n"
_SUBJECT = b"\r\nNats-Subject:"
_SEQUENCE = b"\r\nNats-Sequence:"


def _field(headers: bytes, name: bytes) -> bytes:
    """One header's value from a raw header block.

    The server sets ``Nats-Subject`` and ``Nats-Sequence`` on a direct-get reply by name,
    replacing any a publisher put on its message (``tests/security/test_log_authority.py``
    forges them), and no value can hold a line break: the one line that starts with the name
    is the server's.
    """
    i = headers.rfind(name)
    if i < 0:
        return b""
    i += len(name)
    end = headers.find(b"\r\n", i)
    return headers[i : end if end >= 0 else len(headers)].strip()


class _Page:
    """Collects one batched direct-get reply stream."""

    __slots__ = ("done", "error", "last", "messages", "pending")

    def __init__(self) -> None:
        self.messages: list[RawMessage] = []
        self.done = asyncio.Event()
        self.pending = 0
        self.last = 0
        self.error: str | None = None

    def on_raw(self, headers: bytes, data: bytes) -> None:
        """A reply as it came off the socket (see ``_stream._Client._process_msg``)."""
        if not headers.startswith(_DATA_LINE):  # a status line: the end of the batch, or an error
            self._on_status(parse_headers(headers))
            return
        seq, subject = _field(headers, _SEQUENCE), _field(headers, _SUBJECT)
        if not seq.isdigit() or not subject:
            self.error = "a direct-get reply without its subject or sequence"
            self.done.set()
            return
        self.messages.append(RawMessage(int(seq), subject.decode(), data))

    async def on_msg(self, msg: Msg) -> None:
        """The same, through nats-py's message objects (a connection not made by ``connect``)."""
        hdrs = msg.headers
        if hdrs is None:
            self.error = "a direct-get reply without headers"
            self.done.set()
            return
        if "Status" in hdrs:
            self._on_status(hdrs)
            return
        self.messages.append(RawMessage(int(hdrs["Nats-Sequence"]), hdrs["Nats-Subject"], msg.data))

    def _on_status(self, hdrs: dict[str, str] | None) -> None:
        status = (hdrs or {}).get("Status", "")
        if hdrs is not None and status == "204":  # end of batch
            self.pending = int(hdrs.get("Nats-Num-Pending", "0") or 0)
            self.last = int(hdrs.get("Nats-Last-Sequence", "0") or 0)
        elif status != "404":  # 404: nothing (more) matches
            self.error = f"{status or 'no status'} {(hdrs or {}).get('Description', '')}"
        self.done.set()


class _Unanswered(BusError):
    """A page request nobody answered, or answered "no responders": the bus is between servers."""


async def _fetch_riding_out(nc: NATS, outage_s: float, fetch: Callable[[], Awaitable[_Page]]) -> _Page:
    """A page, asked again while the bus does not answer (a node restarting, a leader being
    elected), for up to ``outage_s``: a read is as patient as an append. Each try keeps the whole
    ``timeout``: a page of 2,048 events on a busy machine may take seconds, and a page asked again
    too soon is read twice (a dead server's "no responders" comes back at once anyway)."""
    patience = Patience(outage_s, gone=gone_flag(nc))
    while True:
        try:
            return await fetch()
        except _Unanswered as exc:
            last = exc
        await patience.again(last)


async def _fetch(
    nc: NATS,
    api: str,
    req: dict[str, object],
    limit: int,
    timeout: float,
    stream: str,
    sent: asyncio.Event | None,
) -> _Page:
    """One page. ``sent`` (a prefetch someone waits on) is set once the request is on the wire; only
    then is a round trip spent to know it: a first page's caller waits for the page itself."""
    pg = _Page()
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=pg.on_msg, pending_msgs_limit=limit + 16)
    raw = getattr(nc, "raw_handlers", None)
    if raw is not None:
        raw[sub._id] = pg.on_raw
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await nc.publish(api, msgspec.json.encode(req), reply=inbox)
        if sent is not None:
            with contextlib.suppress(nats.errors.Error):  # sent or not, the page's own wait decides
                await nc.flush(max(1, round(timeout)))  # on the wire: the server works meanwhile
            sent.set()
        try:
            await asyncio.wait_for(pg.done.wait(), max(0.0, deadline - loop.time()))
        except TimeoutError as exc:
            raise _Unanswered(
                f"direct get on {stream} from seq {req['seq']} timed out",
                stream=stream,
                seq=int(str(req["seq"])),
            ) from exc
    finally:
        if raw is not None:
            raw.pop(sub._id, None)
        await sub.unsubscribe()
    if pg.error:
        raise (_Unanswered if pg.error.startswith("503") else BusError)(
            f"direct get on {stream} from seq {req['seq']} failed: {pg.error}",
            stream=stream,
            seq=int(str(req["seq"])),
        )
    return pg


async def scan(
    nc: NATS,
    stream: str,
    *,
    start: int = 1,
    up_to: int | None = None,
    subject: str | None = None,
    page: int = DEFAULT_PAGE,
    timeout: float = 10.0,
    outage_s: float = 60.0,
    confirm: Confirm | None = None,
) -> AsyncIterator[list[RawMessage]]:
    """Yield pages of messages with ``start <= seq <= up_to``, in stream order.

    Every message comes with its headers, because the subject it is stored on
    is where its authority comes from (``_authority.py``); the connection's
    header parser is made for this (``_stream._Client``).

    On a replicated stream any replica answers a direct get, and a follower that is behind (one
    just back from a partition, catching up) answers from what it has: its pages end early, and
    it has "nothing more". A read up to a cut must not take that for the end, or a restore would
    rebuild a session from part of its history. So with ``up_to`` and ``confirm`` (the next stored
    sequence at or after a given one on the filter, as the stream's *leader* sees it), where the
    pages end before ``up_to`` the leader is asked whether anything is left; if it is, the pages
    are asked again from there (another replica, or the same one caught up), for up to
    ``outage_s`` without progress.
    """
    api = f"$JS.API.DIRECT.GET.{stream}"

    def request(seq: int) -> tuple[dict[str, object], int]:
        want = page if up_to is None else min(page, up_to - seq + 1)
        req: dict[str, object] = {"seq": seq, "batch": want}
        if subject:
            req["next_by_subj"] = subject
        return req, want

    def start_fetch(seq: int, ahead: asyncio.Event | None = None) -> asyncio.Task[_Page]:
        req, want = request(seq)
        fetch = functools.partial(_fetch, nc, api, req, want, timeout, stream, ahead)
        return asyncio.ensure_future(_fetch_riding_out(nc, outage_s, fetch))

    async def on_its_way(fetch: asyncio.Task[_Page]) -> None:
        """Until the request has left (or the fetch ended): a task only runs when the caller awaits,
        so a page asked for and then handed to a caller that decodes it without awaiting would
        be asked for only once the decoding is done, and the server would idle meanwhile."""
        if not sent.is_set():
            waiter = asyncio.ensure_future(sent.wait())
            try:
                await asyncio.wait((waiter, fetch), return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()

    # the next page is requested before this one is handed out, so the server
    # reads it from disk while the caller decodes
    sent = asyncio.Event()
    pending: asyncio.Task[_Page] | None = start_fetch(start) if up_to is None or start <= up_to else None
    seq = start
    behind: Patience | None = None  # asking again after a replica that was behind, since the last progress
    try:
        while pending is not None:
            pg = await pending
            pending = None
            if pg.messages:
                seq = pg.messages[-1].seq + 1
                behind = None
                if pg.pending > 0 and (up_to is None or seq <= up_to):
                    sent.clear()
                    pending = start_fetch(seq, sent)
                    await on_its_way(pending)
            msgs = pg.messages
            if up_to is not None and msgs and msgs[-1].seq > up_to:
                msgs = [m for m in msgs if m.seq <= up_to]
            if msgs:
                yield msgs
            if pending is None and confirm is not None and up_to is not None and seq <= up_to:
                nxt = await confirm(seq, subject)
                if nxt is not None and nxt <= up_to:  # the replica that answered is behind the leader
                    behind = behind or Patience(outage_s, gone=gone_flag(nc))
                    await behind.again(
                        BusError(
                            f"every replica that answered a read of {stream} is behind its leader "
                            f"(seq {nxt} is stored, not served) for {outage_s:.0f} s",
                            stream=stream,
                            seq=nxt,
                        )
                    )
                    pending = start_fetch(nxt)
    finally:
        if pending is not None:
            pending.cancel()


async def scan_merged(
    nc: NATS,
    stream: str,
    subjects: list[str],
    *,
    start: int = 1,
    up_to: int | None = None,
    outage_s: float = 60.0,
    confirm: Confirm | None = None,
) -> list[RawMessage]:
    """Everything matching any of ``subjects``, merged into stream order."""
    runs: list[list[RawMessage]] = []
    for subject in subjects:
        run: list[RawMessage] = []
        scanning = scan(
            nc, stream, start=start, up_to=up_to, subject=subject, outage_s=outage_s, confirm=confirm
        )
        async for pg in scanning:
            run.extend(pg)
        runs.append(run)
    if len(runs) == 1:
        return runs[0]
    return list(heapq.merge(*runs, key=lambda m: m.seq))
