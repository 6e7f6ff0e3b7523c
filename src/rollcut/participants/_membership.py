"""Membership: who takes part in a checkpoint, without waiting a fixed time for late answers.

A ping (``rc.<ns>.ping``, a round id as its body) is answered by every live
participant on its own subject ``rc.<ns>.hello.<component>.<instance>``. Who
answered is read from that subject, never from the answer: with per-instance
identities only the instance's own identity may publish there (docs/security.md),
so a participant cannot answer as another instance or as one that does not exist.
An answer's group and worker must name the instance (``<group>-w<worker>``, or the
group itself for a lone instance), so no instance can speak for another's group.

The question is when to stop listening. Waiting until replies go quiet for a
while costs that while on every checkpoint (most of a steady one). So the
coordinator keeps a standing view: the members that answered its last round,
plus every participant that announced itself since (a participant publishes a
hello without a round once it is discoverable). A round ends the moment every
known member answered and every coordinated group is complete. Only when a known
member is missing (it left, or it is slow) does the round fall back to waiting
for quiet, bounded by the discovery timeout; the view then forgets it. A group
that declares more workers than answered is waited for longer (``short_s``,
3 s): its workers exist, and under load one answers late. An instance the caller
expects by name is waited for as long as the caller says (a checkpoint: half its
deadline). An announcement during a round counts as an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from typing import Any

import msgspec

from .._errors import CheckpointError, CheckpointFailedError
from ..bus import EventLog
from ._protocol import Hello, names_itself

__all__ = ["InstanceInfo", "Membership", "check_membership"]

_MAX_HELLO = 4096
_MAX_KNOWN = 65_536
_hello_decoder = msgspec.json.Decoder(Hello)


class InstanceInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One live participant instance, as its answer to a membership ping names it."""

    service_id: str
    instance: str
    component: str
    group: str
    worker: int
    workers: int
    mode: str
    control: str


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
        self._round = ""
        self._on_answer: Callable[[InstanceInfo], None] | None = None
        self._prefix = f"{log.subjects.prefix}.hello"

    async def listen(self) -> None:
        """Start hearing announcements and answers (idempotent)."""
        if self._sub is None:
            self._sub = await self.log.nc.subscribe(self.log.subjects.hello("*", "*"), cb=self._hello)

    async def close(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await sub.unsubscribe()

    def _info(self, msg: Any) -> tuple[str, InstanceInfo] | None:
        parts = str(msg.subject).split(".")
        if len(parts) != 5 or ".".join(parts[:3]) != self._prefix:
            return None
        component, instance = parts[3], parts[4]
        data = bytes(msg.data)
        if len(data) > _MAX_HELLO:
            return None
        try:
            hello = _hello_decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None  # not one of ours
        if not names_itself(instance, hello.group, hello.worker, hello.workers):
            return None
        info = InstanceInfo(
            service_id=hello.process,
            instance=instance,
            component=component,
            group=hello.group,
            worker=hello.worker,
            workers=hello.workers,
            mode=hello.mode,
            control=self.log.subjects.control(f"{component}.{instance}"),
        )
        return hello.round, info

    async def _hello(self, msg: Any) -> None:
        got = self._info(msg)
        if got is None:
            return
        round_id, info = got
        if self._on_answer is not None and round_id in (self._round, ""):
            # an announcement during a round is an answer too: the participant started after the
            # ping went out, and it is live and listening for control now
            self._on_answer(info)
        elif not round_id and len(self.known) < _MAX_KNOWN:
            self.known.add(info.instance)

    async def discover(
        self,
        *,
        timeout: float | None = None,
        expect: frozenset[str] = frozenset(),
        expect_s: float | None = None,
    ) -> list[InstanceInfo]:
        """Every live participant instance: the answers to one ping. The ``expect``ed instances are
        waited for ``expect_s`` (a short group's wait unless told: a fresh coordinator knows nobody
        yet, and a busy participant answers late); one still missing after that is for the caller
        to refuse."""
        await self.listen()
        nc = self.log.nc
        got: list[InstanceInfo] = []
        answered: set[str] = set()
        want = set(self.known) | expect
        news = asyncio.Event()
        last_at = [0.0]

        def on_answer(info: InstanceInfo) -> None:
            got.append(info)
            answered.add(info.instance)
            last_at[0] = time.monotonic()
            news.set()

        self._round, self._on_answer = secrets.token_hex(8), on_answer
        fast = False
        try:
            await nc.publish(self.log.subjects.ping(), self._round.encode())
            await asyncio.shield(nc.flush())  # nats-py: a cancelled flush kills its read loop
            start, base = time.monotonic(), (timeout if timeout is not None else self.timeout_s)
            while True:
                groups, named = _groups_complete(got), expect <= answered
                complete = groups and named
                # a group short of a worker is listened to longer: under load (dozens of processes
                # on two cores, measured in the scale test) a live worker's answer can take > 0.5 s;
                # an instance the caller named, as long as the caller allows (a model server beside
                # vLLM's CPU engine on two cores once took over 3 s)
                wait = base if groups else max(base, self.short_s)
                if not named:
                    wait = max(wait, self.short_s if expect_s is None else expect_s)
                left = start + wait - time.monotonic()
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
            self._round, self._on_answer = "", None
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
