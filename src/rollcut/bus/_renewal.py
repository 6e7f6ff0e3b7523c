"""Identities that expire, renewed while their process lives (issue 54).

Every identity rollcut mints carries an expiry (``exp``, ``Credentials.identity_ttl_s`` after it
is issued; an hour unless the credentials say otherwise). nats-server closes a connection whose
identity expires, and refuses the identity from then on: a copy that outlived its process (a
file, a core dump, a captured pipe) stops working within the hour instead of forever.

A live process keeps its own identity alive. At half its life the same identity (same name,
same user key, so the identity authority sees nothing new and revokes nothing) is issued again
for as long, and the connection reconnects with it (``force_reconnect``: nats-py re-subscribes
and sends what it buffered; a JetStream acknowledgement that crosses the reconnect is asked for
again under the same message id, so nothing is stored twice). Who issues it again:

- a process holding its role's signing key (a server with its role's file, the coordinator, the
  collector, the CLI) signs it itself (:class:`SelfRenewal`);
- a worker of a several-worker server holds no signing key (it could make any identity of its
  role): its parent writes each renewal into the pipe it gave the worker its identity through
  (:class:`WorkerIdentities` on the parent's side, :class:`PipeRenewal` on the worker's).

A process whose renewal stops (its parent gone) is closed by the server at the expiry, and
exits as a lost bus does (``BUS_LOST``, 77).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import IO, Protocol

import msgspec
from nats.aio.client import Client as NATS

from .._errors import ConfigError
from ._jwt import decode_claims, encode_jwt

__all__ = [
    "DEFAULT_IDENTITY_TTL_S",
    "PipeRenewal",
    "Renewals",
    "Renewed",
    "SelfRenewal",
    "Ticket",
    "WorkerIdentities",
    "keep_renewed",
    "renewed",
]

DEFAULT_IDENTITY_TTL_S = 3600
"""How long an identity is good for after it is issued, unless the credentials say otherwise."""
MAX_RENEWAL_BYTES = 64 * 1024
"""The most a worker reads of one renewal line from its parent (one is ~1 KB)."""


def lifetime(token: str) -> tuple[int, int] | None:
    """An identity's issue time and expiry (None: it does not expire)."""
    return _life(decode_claims(token))


def _life(claims: dict[str, object]) -> tuple[int, int] | None:
    iat, exp = claims.get("iat"), claims.get("exp")
    return (iat, exp) if isinstance(iat, int) and isinstance(exp, int) else None


def half_life(token: str) -> float | None:
    """When an identity is renewed: half way through its life (None: it does not expire)."""
    life = lifetime(token)
    return None if life is None else sum(life) / 2


def renewed(token: str, signing_seed: str) -> str:
    """The same identity (name, user key, permissions) issued again now, for as long as before."""
    claims = decode_claims(token)
    life = _life(claims)
    if life is None:
        raise ConfigError("an identity without an expiry is not renewed")
    now = int(time.time())
    claims["exp"] = now + (life[1] - life[0])
    return encode_jwt(signing_seed, claims, issued_at=now)


class Ticket:
    """The identity a connection shows at its next (re)connect: renewed in place."""

    def __init__(self, jwt: str) -> None:
        self.jwt = jwt


class Renewals(Protocol):
    """Where a process's renewed identities come from (its own key, or its parent)."""

    def newest(self, current: str) -> str:
        """The newest issue of ``current``'s identity there is now (to connect with)."""
        ...

    async def next(self, current: str) -> str:
        """The identity to connect with next, when it is time to (at most half of ``current``'s life)."""
        ...


class SelfRenewal:
    """A process that holds its role's signing key issues its identity again at half its life."""

    def __init__(self, signing_seed: str) -> None:
        self.signing_seed = signing_seed

    def newest(self, current: str) -> str:
        return current  # issued by this process as it connects

    async def next(self, current: str) -> str:
        due = half_life(current)
        assert due is not None  # only expiring identities are renewed
        await asyncio.sleep(max(0.0, due - time.time()))
        return renewed(current, self.signing_seed)


class Renewed(msgspec.Struct, frozen=True, kw_only=True):
    """One renewal a parent writes into its worker's pipe (a line of JSON)."""

    schema_version: int = 1
    jwt: str


class PipeRenewal:
    """A worker's renewals, read from the pipe its parent gave it its identity through (after the
    identity's own line) from the moment it has read that: a worker slow to start connects with the
    newest. At the pipe's end (the parent is gone) none come: the worker's identity expires with
    it, as the worker does (it dies with its parent)."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self.pipe = pipe
        self._latest: str | None = None
        self._lock = threading.Lock()
        self._wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        threading.Thread(target=self._read, daemon=True, name="identity-renewals").start()

    def _read(self) -> None:
        with self.pipe:
            while line := self.pipe.readline(MAX_RENEWAL_BYTES + 1):
                try:
                    got = msgspec.json.decode(line, type=Renewed)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    return  # not from the parent that wrote the identity: no renewal is trusted after it
                if got.schema_version != 1:
                    return  # a parent of another rollcut: this worker's identity ends at its expiry
                jwt = got.jwt
                with self._lock:
                    self._latest, wake = jwt, self._wake
                if wake is not None:
                    wake[0].call_soon_threadsafe(wake[1].set)

    def newest(self, current: str) -> str:
        with self._lock:
            latest = self._latest
        if latest is None or decode_claims(latest).get("sub") != decode_claims(current).get("sub"):
            return current  # none yet, or not this worker's identity
        return latest

    async def next(self, current: str) -> str:
        if self._wake is None:
            self._wake = (asyncio.get_running_loop(), asyncio.Event())
        while (fresh := self.newest(current)) == current:
            await self._wake[1].wait()
            self._wake[1].clear()
        return fresh


async def keep_renewed(nc: NATS, ticket: Ticket, renewals: Renewals, counted: Callable[[], None]) -> None:
    """Forever: renew ``ticket``'s identity when it is time and reconnect with it."""
    while True:
        ticket.jwt = await renewals.next(ticket.jwt)
        await nc.force_reconnect()
        counted()


class WorkerIdentities:
    """The parent's side: each worker's identity as it starts, then the same identity issued again
    at half its life, written into the worker's pipe while the worker lives."""

    def __init__(self, issue: Callable[[int], tuple[bytes, str]], signing_seed: str) -> None:
        self._issue, self.signing_seed = issue, signing_seed
        self._pipes: dict[int, tuple[IO[bytes], str, float]] = {}  # worker: pipe, identity, when due
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def give(self, worker: int, pipe: IO[bytes]) -> None:
        """Write worker ``worker``'s new identity into ``pipe`` (a few KB: within the pipe's buffer,
        whole before the worker reads) and keep the pipe for its renewals."""
        first, jwt = self._issue(worker)
        pipe.write(first + b"\n")
        pipe.flush()
        due = half_life(jwt)
        with self._lock:
            old = self._pipes.pop(worker, None)
            if due is not None:
                self._pipes[worker] = (pipe, jwt, due)
            else:
                pipe.close()
        if old is not None:
            with contextlib.suppress(OSError):
                old[0].close()
        if self._thread is None and self._pipes:
            self._thread = threading.Thread(target=self._renewing, daemon=True, name="worker-renewals")
            self._thread.start()

    def _renewing(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                held = [(w, jwt, due) for w, (_, jwt, due) in self._pipes.items()]
            soonest = min((due for _, _, due in held), default=None)
            if self._stop.wait(max(0.05, soonest - time.time()) if soonest is not None else 1.0):
                return
            for worker, jwt, due in held:
                if time.time() >= due:
                    self._renew(worker, jwt)

    def _renew(self, worker: int, jwt: str) -> None:
        fresh = renewed(jwt, self.signing_seed)
        with self._lock:
            held = self._pipes.get(worker)
            if held is None or held[1] != jwt:
                return  # restarted meanwhile: its new identity has its own life
            due = half_life(fresh)
            assert due is not None  # a renewal lives as long as what it renews
            try:
                held[0].write(msgspec.json.encode(Renewed(jwt=fresh)) + b"\n")
                held[0].flush()
            except OSError:  # the worker is gone; its restart gives a new pipe
                self._pipes.pop(worker, None)
                return
            self._pipes[worker] = (held[0], fresh, due)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            for pipe, _, _ in self._pipes.values():
                with contextlib.suppress(OSError):
                    pipe.close()
            self._pipes.clear()
