"""One collector per namespace: a lease on the bus, taken and renewed by compare-and-set.

Two collectors on one namespace drive the same rollouts against each other: each heals the
other's runs as crashes, forever. The lease is the last record on ``rc.<ns>.mark.collector``;
every write of it expects the sequence read before, so of two collectors starting together
exactly one takes it. It is renewed at a third of its time to live; another collector takes it
over only once it has expired, been released, or names a process of this host that is gone (a
collector that was SIGKILLed and is run again with ``--resume`` need not wait out its own lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable

from .._errors import CollectorBusyError, RollcutError
from .._process import pid_alive
from ..bus import CollectorLease, EventLog

__all__ = ["DEFAULT_LEASE_TTL_S", "NamespaceLease"]

_CAS_TRIES = 5  # reads of the lane and sets at its end, before giving up to a racing collector
DEFAULT_LEASE_TTL_S = 30.0
"""How long a collector's lease outlives its last renewal (a crashed collector's namespace is free
again after this, at once if the crash was on the same host)."""


class NamespaceLease:
    """Held for the life of one collection: ``async with NamespaceLease(log, instance=...)``.

    ``on_lost`` is called (once) if a renewal finds the lease taken: the collection must stop, as
    another collector now drives the namespace. ``renew_every_s``: how often it renews (default a
    third of the TTL).
    """

    def __init__(
        self,
        log: EventLog,
        *,
        instance: str,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        on_lost: Callable[[RollcutError], None] | None = None,
        renew_every_s: float | None = None,
    ) -> None:
        self.log = log
        self.instance = instance
        self.ttl_s = ttl_s
        self.on_lost = on_lost
        self.collection = os.urandom(8).hex()
        self.host = socket.gethostname()[:255]
        self.seq = 0
        self._valid_until = 0.0
        self._renewer: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._renew_every_s = ttl_s / 3 if renew_every_s is None else renew_every_s

    def _record(self, *, released: bool = False) -> CollectorLease:
        return CollectorLease(
            component="collector",
            instance=self.instance,
            collection=self.collection,
            host=self.host,
            pid=os.getpid(),
            ttl_s=self.ttl_s,
            expires_at=time.time() + self.ttl_s,
            released=released,
        )

    async def acquire(self) -> None:
        """Take the namespace's lease: read who holds it, and take it over by a compare-and-set on
        the lane if nobody live does. A set that fails is read again: another collector took it
        first (then it is live, and this one is refused), or the read saw the lane behind its end (a
        replica just back from a partition answered it; seen in CI), and the lease is taken at the
        lane's real end if its holder is as gone as it looked."""
        lane = self.log.subjects.mark("collector")
        for _ in range(_CAS_TRIES):
            last = await self.log.last_on(lane)
            held = last.event if last is not None else None
            if isinstance(held, CollectorLease) and self._live(held):
                raise self._busy(held)
            seq = await self.log.append_expecting(self._record(), last.seq if last is not None else 0)
            if seq is not None:
                break
        else:
            raise CollectorBusyError(
                "another collector took this namespace's lease first", namespace=self.log.subjects.namespace
            )
        self.seq, self._valid_until = seq, time.time() + self.ttl_s
        self._stopping.clear()
        self._renewer = asyncio.ensure_future(self._renew())

    async def release(self) -> None:
        if self._renewer is not None:
            # ended by the flag, never by cancelling: a cancel that lands in a renewal's publish can let
            # the renewal land on the server with its sequence lost here, and the release below would
            # then expect a stale sequence and leave the lease held for a whole TTL (seen in CI: the
            # gemma demo's next phase refused)
            self._stopping.set()
            await self._renewer
            self._renewer = None
        if self.seq:
            # a lost lease is not ours to release; a failed release expires by itself
            with contextlib.suppress(RollcutError):
                await self.log.append_expecting(self._record(released=True), self.seq)
            self.seq = 0

    def abandon(self) -> None:
        """Stop renewing without a release: the bus is gone and a release would only wait on it. The
        lease expires by its TTL, or the next collector of this host takes it over (its holder is
        gone)."""
        self._stopping.set()
        if self._renewer is not None:
            self._renewer.cancel()  # its sequence no longer matters: nothing is released after it
            self._renewer = None
        self.seq = 0

    async def __aenter__(self) -> NamespaceLease:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    async def _renew(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._renew_every_s)
                return
            try:
                seq = await self.log.append_expecting(self._record(), self.seq)
            except (RollcutError, OSError, TimeoutError) as exc:  # the bus is away: retry until expiry
                if time.time() > self._valid_until:
                    self._lost(
                        CollectorBusyError(
                            f"this collector could not renew its lease before it expired: {exc}",
                            namespace=self.log.subjects.namespace,
                            holder=self.collection,
                        )
                    )
                    return
                continue
            if seq is None:
                self._lost(
                    CollectorBusyError(
                        "this collector's lease was taken over by another collector: it stops",
                        namespace=self.log.subjects.namespace,
                        holder=self.collection,
                    )
                )
                return
            self.seq, self._valid_until = seq, time.time() + self.ttl_s

    def _lost(self, exc: RollcutError) -> None:
        self.seq = 0
        if self.on_lost is not None:
            self.on_lost(exc)

    def _live(self, lease: CollectorLease) -> bool:
        if lease.released or lease.expires_at <= time.time():
            return False
        return not (lease.host == self.host and not pid_alive(lease.pid))

    def _busy(self, lease: CollectorLease) -> CollectorBusyError:
        left = max(0.0, lease.expires_at - time.time())
        return CollectorBusyError(
            f"namespace {self.log.subjects.namespace!r} is held by collector {lease.instance} "
            f"(collection {lease.collection}, host {lease.host}, pid {lease.pid}) for {left:.0f} s more "
            "unless it renews: stop it first, or use another namespace",
            namespace=self.log.subjects.namespace,
            holder=lease.collection,
            host=lease.host,
            pid=lease.pid,
            expires_in_s=round(left, 1),
        )
