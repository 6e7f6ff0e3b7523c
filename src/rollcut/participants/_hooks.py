"""What a participant's owner plugs in: the hooks the control plane calls.

Every hook but ``prepare``/``restore`` is optional and declared as its own
Protocol; the runtime checks for it by type, once, not by name at each call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from .._errors import RollcutError
from ..bus import AttemptOpened, EventLog, ResultAccepted, RolloutRetired
from ._protocol import PrepareReport

__all__ = ["LifecycleWatch", "ParticipantHooks", "ReleaseHook", "RetireHook", "SupersedeHook"]


class ParticipantHooks(Protocol):
    """What an ``exported`` participant does at prepare and restore."""

    async def prepare(self, checkpoint_id: str) -> list[str] | PrepareReport:
        """Append snapshot events for state the log cannot reproduce; return what still cannot be
        (a model server returns a PrepareReport listing every admitted call's disposition)."""
        ...

    async def restore(self, checkpoint_id: str, cut: int) -> None:
        """Rebuild sessions from the log up to ``cut``; stay paused until resume."""
        ...


@runtime_checkable
class RetireHook(Protocol):
    """Optional on hooks: drop everything held for a rollout that is over.

    Called once the log confirms the rollout was retired (``reason`` is the
    retirement's) or its result was accepted (``reason`` ``"accepted"``).
    """

    def retire(self, rollout_id: str, reason: str) -> Awaitable[None] | None: ...


@runtime_checkable
class SupersedeHook(Protocol):
    """Optional on hooks: attempt ``attempt`` of the rollout opened, so every older attempt's work
    held here is over (its writes are fenced off; kept, a prepare would only try to export it)."""

    def supersede(self, rollout_id: str, attempt: int) -> object: ...


class _NoHooks:
    async def prepare(self, checkpoint_id: str) -> list[str]:
        return []

    async def restore(self, checkpoint_id: str, cut: int) -> None:
        return None


@runtime_checkable
class ReleaseHook(Protocol):
    """Optional on hooks: a checkpoint this participant paused for is over (parked work goes on)."""

    def release(self, checkpoint_id: str) -> None: ...


class LifecycleWatch:
    """Tells a :class:`RetireHook` about every rollout that is over: retired, or handed off."""

    def __init__(self, log: EventLog, hook: RetireHook) -> None:
        self.log = log
        self.hook = hook
        self.dropped = 0
        self._subs: list[Any] = []
        self._tasks: set[asyncio.Future[None]] = set()

    async def start(self) -> None:
        """Subscribe to the fences and the collector's hand-offs."""
        p = self.log.subjects.prefix
        for subject in (f"{p}.fence.*", f"{p}.ev.*.*.collector"):
            self._subs.append(await self.log.nc.subscribe(subject, cb=self._on_lifecycle_msg))

    async def stop(self) -> None:
        """Unsubscribe and drop what is still being looked at."""
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs = []
        for task in list(self._tasks):
            task.cancel()

    async def _on_lifecycle_msg(self, msg: Any) -> None:
        # one task per message: a look-again for one must not hold up the messages behind it
        task = asyncio.ensure_future(self._on_lifecycle(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _on_lifecycle(self, msg: Any) -> None:
        """A retirement or a hand-off seen on the wire; acted on only once the stream has it.

        Core delivery is a hint (a fenced write the server then refused is delivered too), so
        the fence, or the stored acceptance, is read back before anything is dropped.
        """
        try:
            ev = self.log.codec.decode(msg.data, stream=self.log.stream, seq=0, subject=msg.subject)
        except RollcutError:
            return
        if isinstance(ev, RolloutRetired):
            reason = ev.reason or "retired"

            async def stored() -> bool:
                state = await self.log.fence_state(ev.rollout_id)
                return state is not None and state.retired

        elif isinstance(ev, ResultAccepted):
            reason = "accepted"

            async def stored() -> bool:
                last = await self.log.last_on(msg.subject)
                return last is not None and isinstance(last.event, ResultAccepted)

        elif isinstance(ev, AttemptOpened) and isinstance(self.hook, SupersedeHook):
            opened = ev

            async def held() -> bool:
                state = await self.log.fence_state(opened.rollout_id)
                return state is not None and state.attempt >= opened.attempt

            if await _eventually(held):
                self.hook.supersede(ev.rollout_id, ev.attempt)
            return
        else:
            return
        if not await _eventually(stored):
            return  # the server refused it: nothing is over
        self.dropped += 1
        out = self.hook.retire(ev.rollout_id, reason)
        if asyncio.iscoroutine(out):
            await out


async def _eventually(check: Callable[[], Awaitable[bool]]) -> bool:
    """Core delivery can overtake the stream's write: look again for a moment before giving up."""
    for delay in (0.0, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6):
        await asyncio.sleep(delay)
        if await check():
            return True
    return False
