"""Membership: who takes part in a checkpoint, without waiting a fixed time for late answers.

A ping (``$SRV.PING`` of the namespace's service) is answered by every live
participant. The question is when to stop listening. Waiting until replies go
quiet for a while costs that while on every checkpoint (most of a steady one).
So the coordinator keeps a standing view: the members that answered its last
round, plus every participant that announced itself since (a participant
publishes its instance name on ``rc.<ns>.hello.<component>`` once it is
discoverable). A round ends the moment every known member answered and every
coordinated group is complete. Only when a known member is missing (it left,
or it is slow) does the round fall back to waiting for quiet, bounded by the
discovery timeout; the view then forgets it. A group that declares more
workers than answered is waited for longer (``short_s``, 3 s): its workers
exist, and under load one answers late.

An announcement only ever makes a round wait for someone: a forged name costs at
most one quiet wait, never a wrong membership (the ping's answers decide who
takes part).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import msgspec

from .._errors import CheckpointError, CheckpointFailedError
from ..bus import EventLog
from ._runtime import service_name

__all__ = ["InstanceInfo", "Membership", "check_membership"]

_MAX_NAME = 256
_MAX_KNOWN = 65_536


class InstanceInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One live participant instance, as discovered by ``$SRV.PING``."""

    service_id: str
    instance: str
    component: str
    group: str
    worker: int
    workers: int
    mode: str
    control: str


def _info(data: bytes) -> InstanceInfo | None:
    try:
        ping = msgspec.json.decode(data)
        md = ping.get("metadata") or {}
        return InstanceInfo(
            service_id=ping["id"],
            instance=md["instance"],
            component=md["component"],
            group=md.get("group", md["instance"]),
            worker=int(md.get("worker", 0)),
            workers=int(md.get("workers", 1)),
            mode=md.get("mode", ""),
            control=md["control"],
        )
    except (KeyError, ValueError, TypeError, AttributeError, msgspec.DecodeError):
        return None  # not one of ours


class Membership:
    """The coordinator's standing view of the participants of one namespace."""

    def __init__(
        self, log: EventLog, *, timeout_s: float = 0.5, idle_s: float = 0.05, short_s: float = 3.0
    ) -> None:
        self.log = log
        self.timeout_s = timeout_s
        self.short_s = short_s  # how long a round waits for the missing workers of a group
        self.idle_s = idle_s
        self.known: set[str] = set()
        self.rounds_waited = 0  # rounds that had to wait for quiet (a known member missing)
        self._sub: Any = None

    async def listen(self) -> None:
        """Start hearing announcements (idempotent)."""
        if self._sub is None:
            self._sub = await self.log.nc.subscribe(self.log.subjects.hello("*"), cb=self._hello)

    async def close(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await sub.unsubscribe()

    async def _hello(self, msg: Any) -> None:
        name = bytes(msg.data[: _MAX_NAME + 1])
        if 0 < len(name) <= _MAX_NAME and len(self.known) < _MAX_KNOWN:
            self.known.add(name.decode("utf-8", "replace"))

    async def discover(self, *, timeout: float | None = None) -> list[InstanceInfo]:
        """Every live participant instance: the answers to one ping."""
        await self.listen()
        nc = self.log.nc
        inbox = nc.new_inbox()
        got: list[InstanceInfo] = []
        answered: set[str] = set()
        want = set(self.known)
        news = asyncio.Event()
        last_at = [0.0]

        async def on_reply(msg: Any) -> None:
            info = _info(msg.data)
            if info is None:
                return
            got.append(info)
            answered.add(info.instance)
            last_at[0] = time.monotonic()
            news.set()

        sub = await nc.subscribe(inbox, cb=on_reply)
        fast = False
        try:
            await nc.publish(f"$SRV.PING.{service_name(self.log.subjects.namespace)}", b"", reply=inbox)
            await asyncio.shield(nc.flush())  # nats-py: a cancelled flush kills its read loop
            start, base = time.monotonic(), (timeout if timeout is not None else self.timeout_s)
            while True:
                complete = _groups_complete(got)
                # a group short of a worker is listened to longer: under load (dozens of processes
                # on two cores, measured in the scale test) a live worker's answer can take > 0.5 s
                left = start + (base if complete else max(base, self.short_s)) - time.monotonic()
                if left <= 0:
                    break
                if want and want <= answered and complete:
                    fast = True  # everyone known answered: nothing to wait for
                    break
                # quiet is not enough while a group is short of a worker: naming a live one missing
                # would fail the checkpoint for nothing
                if got and complete and time.monotonic() - last_at[0] >= self.idle_s:
                    break
                news.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(news.wait(), min(left, self.idle_s / 2) if got else left)
        finally:
            await sub.unsubscribe()
        self.rounds_waited += not fast
        by_name: dict[str, InstanceInfo] = {}
        for info in got:
            other = by_name.get(info.instance)
            if other is not None and other.service_id != info.service_id:
                raise CheckpointError(f"two live processes both claim instance name {info.instance!r}")
            by_name[info.instance] = info
        # the view: who answered, and whoever announced itself meanwhile
        self.known = set(by_name) | (self.known - want)
        return sorted(by_name.values(), key=lambda i: i.instance)


def check_membership(found: list[InstanceInfo], expect: set[str]) -> None:
    """Every worker of every coordinated group, and every expected instance, must be live."""
    names = {i.instance for i in found}
    missing = sorted(expect - names)
    for group, (want, have) in sorted(_groups(found).items()):
        missing += [f"{group} worker {w} of {want}" for w in range(want) if w not in have]
    if missing:
        raise CheckpointFailedError(f"missing participant instances: {', '.join(missing)}")


def _groups(found: list[InstanceInfo]) -> dict[str, tuple[int, set[int]]]:
    """Each coordinated group: how many workers it declares, and which were heard from."""
    groups: dict[str, tuple[int, set[int]]] = {}
    for i in found:
        groups.setdefault(i.group, (i.workers, set()))[1].add(i.worker)
    return groups


def _groups_complete(found: list[InstanceInfo]) -> bool:
    """Whether every coordinated group heard from has every one of its workers."""
    return all(have >= set(range(want)) for want, have in _groups(found).values())
