"""The stream's own API, asked patiently: gets, stream info and purges that ride out a bus between
servers (a node restarting, a stream leader being elected) for ``BusConfig.outage_s``.

On a replicated stream any replica answers a direct get, and one that has not applied the latest
write yet answers with the record before it. Every compare-and-set (a fence, a lane) starts from
"the last record on this subject", so there the stream's leader is asked instead (its message-get
API, which only the leader answers): a writer never takes itself for stale because a follower lags.
"""

from __future__ import annotations

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.api import StreamInfo

from .._errors import BusError
from ._patience import Patience, gone_flag
from ._read import RawMessage
from ._stream import ApiError, BusConfig
from ._subjects import COLLECTOR_LANE, Subjects

__all__ = ["StreamApi"]


class _StoredMsg(msgspec.Struct, frozen=True):
    subject: str
    seq: int
    data: bytes = b""  # base64 on the wire: msgspec decodes it into bytes


class _MsgGetReply(msgspec.Struct, frozen=True):
    message: _StoredMsg | None = None
    error: ApiError | None = None


_msg_get_decoder = msgspec.json.Decoder(_MsgGetReply)


class _PurgeReply(msgspec.Struct, frozen=True):
    success: bool = False
    purged: int = 0
    error: ApiError | None = None


_purge_decoder = msgspec.json.Decoder(_PurgeReply)


class StreamApi:
    """The stream-API half of :class:`~rollcut.bus.EventLog`."""

    nc: NATS
    config: BusConfig
    replicas: int
    subjects: Subjects

    @property
    def stream(self) -> str:
        raise NotImplementedError

    async def stream_info(self, subjects_filter: str | None = None) -> StreamInfo:
        """The stream's state and config, riding out a bus between servers for ``outage_s``; with
        ``subjects_filter``, ``state.subjects`` counts the messages on each subject matching it."""
        patience = Patience(self.config.outage_s, gone=gone_flag(self.nc))
        js = self.nc.jetstream(timeout=min(2.0, self.config.request_timeout_s))
        while True:
            try:
                return await js.stream_info(self.stream, subjects_filter=subjects_filter)
            except (NatsError, OSError) as exc:  # timeouts, no responders, 503 (no leader yet)
                cause = repr(exc)
            await patience.again(
                BusError(
                    f"stream {self.stream} did not answer for {self.config.outage_s:.0f} s: {cause}",
                    stream=self.stream,
                )
            )

    async def next_stored(self, seq: int, subject: str | None) -> int | None:
        """The sequence of the first record at or after ``seq`` on ``subject`` (None: the whole
        stream), as the stream's leader sees it; None if there is none. What a read up to a cut asks
        where a replica's pages ended early (``_read.scan``)."""
        got = await self._leader_get(
            {"seq": seq, "next_by_subj": subject or ">"}, f"the record after seq {seq}"
        )
        return None if got is None else got.seq

    async def probe(self, timeout_s: float) -> str | None:
        """Ask the stream's leader once, for at most ``timeout_s``: None if it answered, else why
        not. Not patient, on purpose: this is how a collection notices that the bus has lost its
        quorum (``collect/_buswatch.py``), where every other request rides the outage out.

        What is asked is the last record on the collector's lease lane through the message-get
        API, which only a stream leader answers (a record or "none": either is an answer). Stream
        info is not a probe: a replica left alone without a quorum answers it from its own state
        after a few seconds (measured: two of three nodes SIGKILLed, answered again after 10 s).
        """
        lane = self.subjects.mark(COLLECTOR_LANE)
        req = msgspec.json.encode({"last_by_subj": lane})
        try:
            msg = await self.nc.request(f"$JS.API.STREAM.MSG.GET.{self.stream}", req, timeout=timeout_s)
            self._stored_msg(msg, lane)
        except (NatsError, OSError) as exc:  # timeouts, no responders, a connection being re-made
            return f"{type(exc).__name__}: {exc}"[:200]
        except BusError as exc:  # answered, but not by a leader: 503, no quorum
            return str(exc)[:200]
        return None

    async def purge(self, subject: str, *, below: int | None = None, keep: int | None = None) -> int:
        """Delete the stream's records on ``subject`` (a filter; wildcards allowed): all of them, those
        with a sequence below ``below``, or all but the last ``keep``. Returns how many went.

        Only compaction calls this (``rollcut.ledger.compact``): rollcut's stream is append-only
        otherwise, and what compaction deletes is what no kept checkpoint can read again.
        """
        req: dict[str, object] = {"filter": subject}
        if below is not None:
            req["seq"] = below
        if keep is not None:
            req["keep"] = keep
        msg = await self._ask(f"$JS.API.STREAM.PURGE.{self.stream}", req, f"a purge of {subject}")
        try:
            reply = _purge_decoder.decode(msg.data)
        except msgspec.DecodeError as exc:
            raise BusError(f"purge of {subject}: unreadable answer", stream=self.stream) from exc
        if reply.error is not None:
            raise BusError(
                f"purge of {subject} refused: {reply.error.err_code} {reply.error.description}",
                stream=self.stream,
                subject=subject,
            )
        return reply.purged

    async def _direct_last(self, subject: str) -> RawMessage | None:
        """The last record on ``subject``: what every compare-and-set (fence, lanes) starts from.

        On a replicated stream any replica answers a direct get, and one that has not yet applied
        the latest write answers with the record before it; a compare-and-set built on that would
        be refused, and the writer would take itself for stale. So there the stream's leader is
        asked (the stream's message-get API, which only the leader answers).
        """
        if self.replicas > 1:
            return await self._leader_get({"last_by_subj": subject}, subject)
        return await self._direct_get({"last_by_subj": subject}, subject)

    async def _leader_get(self, req: dict[str, object], what: str) -> RawMessage | None:
        return self._stored_msg(await self._ask(f"$JS.API.STREAM.MSG.GET.{self.stream}", req, what), what)

    def _stored_msg(self, msg: Msg, what: str) -> RawMessage | None:
        """A message-get answer: the record, None for "no such record", or why it is neither."""
        try:
            reply = _msg_get_decoder.decode(msg.data)
        except msgspec.DecodeError as exc:
            raise BusError(
                f"get of the last record on {what}: unreadable answer", stream=self.stream
            ) from exc
        if reply.error is not None:
            if reply.error.code == 404:
                return None
            raise BusError(
                f"get of the last record on {what} failed: {reply.error.err_code} {reply.error.description}",
                stream=self.stream,
            )
        if reply.message is None:
            raise BusError(
                f"get of the last record on {what}: an answer without a message", stream=self.stream
            )
        m = reply.message
        return RawMessage(m.seq, m.subject, m.data)

    async def _direct_get(self, req: dict[str, object], what: str) -> RawMessage | None:
        msg = await self._ask(f"$JS.API.DIRECT.GET.{self.stream}", req, what)
        hdrs = msg.headers or {}
        status = hdrs.get("Status")
        if status == "404":
            return None
        if status:
            raise BusError(
                f"direct get of {what} failed: {status} {hdrs.get('Description', '')}", stream=self.stream
            )
        return RawMessage(int(hdrs["Nats-Sequence"]), hdrs["Nats-Subject"], msg.data)

    async def _ask(self, api: str, req: dict[str, object], what: str) -> Msg:
        """A JetStream API request, asked again while nobody answers (no leader yet, a node
        restarting) for up to ``outage_s``: a read is as patient as an append."""
        patience = Patience(self.config.outage_s, gone=gone_flag(self.nc))
        body = msgspec.json.encode(req)
        while True:
            try:
                msg = await self.nc.request(api, body, timeout=min(2.0, self.config.request_timeout_s))
                # a status 503 (direct get), or an API error 503 (no leader for the stream yet)
                if (msg.headers or {}).get("Status") != "503" and b'"code":503' not in msg.data[:256]:
                    return msg
                cause = "503: no server answers for the stream (a leader being elected?)"
            except NatsError as exc:
                cause = repr(exc)
            await patience.again(
                BusError(
                    f"get of {what} got no answer for {self.config.outage_s:.0f} s: {cause}",
                    stream=self.stream,
                )
            )
