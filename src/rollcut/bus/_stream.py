"""Connecting to NATS and setting up the event stream.

One stream per namespace holds every event, fence and marker, in one total
order: that order is what makes every prefix a consistent cut.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import msgspec
import nkeys
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StoreCompression, StreamConfig
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError

from .._errors import BusError, ConfigError
from ._auth import Credentials
from ._jwt import decode_claims
from ._parser import FastParser
from ._patience import Patience
from ._renewal import Ticket
from ._server import check_version, parse_version
from ._subjects import Subjects

__all__ = ["ApiError", "BusConfig", "Denials", "PubAck", "connect", "ensure_stream", "login_options"]

# JetStream error codes rollcut reacts to.
ERR_WRONG_LAST_SEQUENCE = 10071
ERR_BATCH_DUPLICATE_MSG_ID = 10201
# out of room: the store refused the write (a byte or message limit with discard new: 10077, "maximum
# bytes exceeded" and kin), the server's JetStream storage is exhausted (10047), or the account's (10002)
ERRS_OUT_OF_ROOM = frozenset({10077, 10047, 10002})


class BusConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Where the bus is and how the stream behaves.

    ``url=None`` means the embedded default; the caller starts an
    :class:`EmbeddedServer` and passes its URL. ``url`` may list several servers of one cluster,
    comma-separated: the client connects to whichever answers and fails over to the others.
    ``replicas`` is how many copies the stream is created with (3 on a three-node cluster).
    ``outage_s`` is how long an append rides out a bus that does not answer (a stream leader
    being elected, a node restarting, a cluster without quorum) before it fails.
    ``ping_interval_s`` is how often the client checks that its server still answers; three
    unanswered checks and it moves to another server. nats-py's default, 120 s with two
    outstanding, left every client of a node cut off by a partition (no connection reset ever
    arrives) hanging for minutes while the rest of the cluster went on (issue 34).
    ``min_batch`` is the fewest queued appends that leave as one atomic batch; fewer go as
    acknowledged publishes sent together (nats-server spends ~0.4 ms of CPU setting up and removing
    an atomic batch's staging store, however small the batch; docs/event-log.md, "Group commit").
    ``compression`` is the new stream's storage compression: ``s2`` (the default) stores each
    sealed block S2-compressed, which takes the ~200 bytes of repetitive headers per event nearly
    away; ``none`` stores it as it is. It applies when rollcut creates the stream; an existing
    stream keeps its own (docs/event-log.md).
    """

    url: str | None = None
    namespace: str = "default"
    replicas: int = 1
    duplicate_window_s: float = 120.0
    max_batch: int = 500
    min_batch: int = 32
    max_inflight: int = 8
    user: str | None = None
    password: str | None = None
    nkey_seed: str | None = None
    user_jwt: str | None = None  # schema 3: this process's own identity (with its key's nkey_seed)
    signing_seed: str | None = None  # schema 3: the role's key, when this process renews its identity
    role: str | None = None
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 10.0
    outage_s: float = 60.0
    ping_interval_s: float = 5.0
    compression: Literal["s2", "none"] = "s2"

    @property
    def identity_name(self) -> str | None:
        """The name of this config's own identity (schema 3), which the server's permissions use."""
        if self.user_jwt is None:
            return None
        name = decode_claims(self.user_jwt).get("name")
        return name if isinstance(name, str) else None

    def as_role(self, creds: Credentials, role: str, instance: str | None = None) -> BusConfig:
        """The same bus, logged in as ``role`` (instance ``instance``: with schema 3's credentials an
        identity of that name is made now, once, and every connection of this config uses it)."""
        login = creds.login(role, instance)
        return msgspec.structs.replace(self, namespace=creds.namespace, role=role, **login)


class ApiError(msgspec.Struct, frozen=True):
    code: int = 0
    err_code: int = 0
    description: str = ""


class PubAck(msgspec.Struct, frozen=True):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    batch: str = ""
    count: int = 0
    error: ApiError | None = None


_ack_decoder = msgspec.json.Decoder(PubAck)


def parse_ack(data: bytes) -> PubAck:
    try:
        return _ack_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise BusError(f"unreadable JetStream ack {data[:200]!r}") from exc


class Denials:
    """Publish permission violations the server reported on this connection.

    The server drops a denied publish and says so asynchronously; without
    this, the publisher would only notice when its request timed out.
    """

    _RE = re.compile(r'permissions violation for publish to "([^"]+)"', re.IGNORECASE)

    def __init__(self) -> None:
        self.subjects: set[str] = set()
        self._waiters: dict[int, tuple[frozenset[str], asyncio.Future[str]]] = {}

    async def on_error(self, exc: Exception) -> None:
        m = self._RE.search(str(exc))
        if m:
            subject = m.group(1)
            self.subjects.add(subject)
            for key, (watched, fut) in list(self._waiters.items()):
                if subject in watched:
                    del self._waiters[key]
                    if not fut.done():
                        fut.set_result(subject)

    def watch(self, subjects: list[str]) -> asyncio.Future[str]:
        """A future that resolves with the first of ``subjects`` the server denies.

        One entry per watch, not one per subject: a batch watches hundreds of subjects, and
        denials are rare (the error path walks the watches, the publish path does not).
        """
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        watched = frozenset(subjects)
        denied = watched & self.subjects if self.subjects else None
        if denied:
            fut.set_result(next(iter(denied)))
            return fut
        self._waiters[id(fut)] = (watched, fut)
        return fut

    def unwatch(self, fut: asyncio.Future[str]) -> None:
        self._waiters.pop(id(fut), None)


RawHandler = Callable[[bytes, bytes], None]
"""Takes a message's raw header block (``NATS/1.0...``) and its payload."""


class _Client(NATS):
    """nats-py's client with a header parser made for reading a stream back.

    nats-py parses every header with per-character checks; a direct-get reply
    carries a dozen headers, and reading the stored subject of every record
    (where a record's authority comes from) would cost more than decoding it.
    This parser splits lines and ``name: value`` pairs with bytes operations,
    and reads inline status lines (``NATS/1.0 404 No Messages``) as nats-py does.
    """

    def __init__(self) -> None:
        super().__init__()
        self.raw_handlers: dict[int, RawHandler] = {}
        """Subscriptions (by sid) whose messages skip nats-py's message objects, see :meth:`_process_msg`."""
        self._ps = FastParser(self, self.raw_handlers)
        self.bus_gone = asyncio.Event()
        """Set when its owner gives the bus up (``EventLog.give_up``, ``_patience.gone_flag``)."""

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes) -> None:
        """Hand a page reader's messages over as raw bytes.

        A replay reads every event of the history through direct-get pages; nats-py would parse
        each reply's dozen headers into a dict, build a message object and queue it for a task
        that calls back: about three quarters of the read's cost before a single event is
        decoded. A page reader registered in :attr:`raw_handlers` gets the header block and the
        payload as they came off the socket, in order, on the reading task.

        Two private nats-py names are relied on: this method and a subscription's ``_id`` (its
        sid, see ``_read._fetch``); a connection without ``raw_handlers`` reads through message
        objects, slower and the same.
        """
        handler = self.raw_handlers.get(sid)
        if handler is None:
            await super()._process_msg(sid, subject, reply, data, headers)
            return
        handler(headers, data)

    async def _process_headers(self, headers: bytes) -> dict[str, str] | None:
        return parse_headers(headers)


_HDR_LINE_SIZE = len(b"NATS/1.0")


def parse_headers(headers: bytes) -> dict[str, str] | None:
    """A raw header block as a dict; the last of a repeated name wins."""
    if not headers:
        return None
    end = headers.find(b"\r\n")
    first, rest = (headers, b"") if end < 0 else (headers[:end], headers[end + 2 :])
    out: dict[str, str] = {}
    if len(first) > _HDR_LINE_SIZE:  # inline status: NATS/1.0 404 No Messages
        status, _, desc = first[_HDR_LINE_SIZE + 1 :].partition(b" ")
        code = status.strip().decode()
        if code.isdigit():
            out["Status"] = code
        if desc.strip():
            out["Description"] = desc.strip().decode()
    for line in rest.split(b"\r\n"):
        key, sep, value = line.partition(b":")
        if sep and key:
            out[key.decode()] = value.strip().decode()
    return out or None


def login_options(config: BusConfig, ticket: Ticket | None = None) -> dict[str, Any]:
    """nats-py's options for the config's login: a user JWT (``ticket``'s, as it is at each connect:
    renewed in place) and its key's signature of the server's nonce, or a plain nkey."""
    if config.user_jwt is None:
        return {"nkeys_seed_str": config.nkey_seed}
    shown = ticket or Ticket(config.user_jwt)
    key = nkeys.from_seed((config.nkey_seed or "").encode())
    return {
        "user_jwt_cb": lambda: shown.jwt.encode(),
        "signature_cb": lambda nonce: base64.b64encode(key.sign(nonce.encode())),
    }


async def connect(
    config: BusConfig,
    *,
    name: str = "rollcut",
    denials: Denials | None = None,
    on_closed: Callable[[], Awaitable[None]] | None = None,
    ticket: Ticket | None = None,
) -> NATS:
    """Connect and refuse servers too old for fencing and group commit. ``on_closed``: called when the
    connection is closed for good (by its owner, or by the server: nats-py closes on any protocol
    error the server sends, a revoked identity's among them, and does not reconnect)."""
    if not config.url:
        raise ConfigError("no NATS url: start an EmbeddedServer or configure one")

    async def on_error(exc: Exception) -> None:
        if denials is not None:
            await denials.on_error(exc)

    # seconds as floats: nats-py annotates them int but sleeps and waits on them as given
    options: dict[str, Any] = {
        "error_cb": on_error,
        "name": name,
        "user": config.user,
        "password": config.password,
        **login_options(config, ticket),
        "connect_timeout": config.connect_timeout_s,
        # bounded for the first connect: a wrong password or a dead URL must fail, not loop
        "max_reconnect_attempts": 2,
        "allow_reconnect": True,
        "reconnect_time_wait": 0.2,
        "pending_size": 64 * 1024 * 1024,
        "ping_interval": config.ping_interval_s,
        "max_outstanding_pings": 3,
        **({"closed_cb": on_closed} if on_closed is not None else {}),
    }
    nc = _Client()
    servers = [u.strip() for u in config.url.split(",") if u.strip()]
    try:
        await nc.connect(servers=servers, **options)
    except (NatsError, OSError) as exc:
        raise BusError(
            f"cannot connect to {config.url} as {config.role or config.user or 'anonymous'}: {exc!r}"
        ) from exc
    nc.options["max_reconnect_attempts"] = -1  # once in, ride out server restarts indefinitely
    try:
        check_version(parse_version(nc.connected_server_version.__str__()), config.url)
    except Exception:
        await nc.close()
        raise
    return nc


async def ensure_stream(nc: NATS, subjects: Subjects, config: BusConfig) -> int:
    """Create the namespace's stream, or check that an existing one fits; returns its replica count.

    A cluster that is still electing its meta leader (just started, or a node just restarted)
    answers JetStream requests with "unavailable" or not at all for a few seconds: those are
    retried for up to ``config.outage_s``; a refusal (bad config, no permission) is not.
    """
    patience = Patience(config.outage_s, first_s=0.1)
    while True:
        try:
            return await _ensure_stream(nc, subjects, config)
        except _JetStreamNotReady as exc:
            cause = exc.cause
        await patience.again(
            BusError(
                f"JetStream did not answer for {config.outage_s:.0f} s setting up stream "
                f"{subjects.stream}: {cause!r} (a cluster without a quorum of nodes, or a "
                "server without JetStream)",
                stream=subjects.stream,
            )
        )


class _JetStreamNotReady(Exception):
    def __init__(self, cause: Exception) -> None:
        super().__init__(repr(cause))
        self.cause = cause


# "insufficient resources" / "no suitable peers": a cluster whose nodes have not all met yet
_NOT_READY_CODES = frozenset({10008, 10023, 10005})


async def _ensure_stream(nc: NATS, subjects: Subjects, config: BusConfig) -> int:
    js = nc.jetstream(timeout=min(2.0, config.request_timeout_s))  # a cluster forming: ask again soon
    want = StreamConfig(
        name=subjects.stream,
        subjects=subjects.stream_subjects,
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.NEW,
        num_replicas=config.replicas,
        duplicate_window=config.duplicate_window_s,
        allow_direct=True,
        allow_atomic=True,
        compression=StoreCompression.S2 if config.compression == "s2" else StoreCompression.NONE,
    )
    try:
        info = await js.stream_info(subjects.stream)
    except NotFoundError:
        try:
            await js.add_stream(want)
        except APIError as exc:  # unavailable, or peers not met yet: not ready; anything else: refused
            if isinstance(exc, ServiceUnavailableError) or exc.err_code in _NOT_READY_CODES:
                raise _JetStreamNotReady(exc) from exc
            raise BusError(f"cannot create stream {subjects.stream}: {exc}") from exc
        except NatsTimeoutError as exc:  # a role without the create permission is simply not answered
            if config.role in (None, "admin", "coordinator"):
                raise _JetStreamNotReady(exc) from exc
            raise BusError(
                f"stream {subjects.stream} does not exist and this connection cannot create it "
                f"(role {config.role or config.user or 'anonymous'}): "
                "start the coordinator or an admin connection first"
            ) from exc
        return config.replicas
    except (ServiceUnavailableError, NoRespondersError, NatsTimeoutError) as exc:
        raise _JetStreamNotReady(exc) from exc
    have = info.config
    if not have.allow_atomic or not have.allow_direct:
        raise BusError(
            f"stream {subjects.stream} exists without allow_atomic/allow_direct; "
            "rollcut needs both (update the stream or use another namespace)"
        )
    replicas = int(have.num_replicas or 1)
    if replicas < config.replicas:
        raise BusError(
            f"stream {subjects.stream} has {replicas} replica(s), but {config.replicas} were asked for: "
            "an ack would not mean what the configuration promises (raise the stream's replicas with "
            "`nats stream edit`, or ask for fewer)",
            stream=subjects.stream,
        )
    return replicas
