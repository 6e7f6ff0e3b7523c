"""A collection's recoveries: on ``--resume``, and heals of runs that broke off under a live
collector (a Gym process died), each as the runs' next attempts from the newest cut."""

from __future__ import annotations

import asyncio
import time

import httpx

from ..participants import RecoveryMode, Restorer
from ._routing import Routing
from ._summary import CollectorHooks, Summary

__all__ = ["Recovering"]


class Recovering:
    """The recovery half of :class:`~rollcut.collect.Collector` (which sets every attribute)."""

    restorer: Restorer
    recovery: RecoveryMode
    summary: Summary
    hooks: CollectorHooks
    routing: Routing
    heal_timeout_s: float
    _recovery_checkpoint: str | None
    _recover_lock: asyncio.Lock
    _heal_lock: asyncio.Lock
    _interrupted: set[str]
    _stop: asyncio.Event

    async def _recover(self, rollouts: list[str]) -> None:
        async with self._recover_lock:  # a heal and an explicit recovery never plan the same fence twice
            await self._recover_now(rollouts)

    async def _recover_now(self, rollouts: list[str]) -> None:
        chosen, self._recovery_checkpoint = self._recovery_checkpoint, None
        res = await self.restorer.recover(rollouts, self.recovery, chosen)
        if res.sealed is not None:
            self.summary.checkpoints_published += 1
            self.summary.last_checkpoint = res.sealed.record.checkpoint_id
        if res.seal_error is not None:
            self.summary.failed.setdefault("recovery_checkpoint", res.seal_error)
        for kind, n in res.plan.counts().items():  # every recovery of the run (resume, then heals), summed:
            self.summary.recovery[kind] = self.summary.recovery.get(kind, 0) + n  # a heal must not erase it
        self.summary.never_started = len(res.plan.unstarted)
        if self.hooks.recovery:
            self.hooks.recovery(res)

    async def _environments_up(self, client: httpx.AsyncClient) -> bool:
        """Whether every environment server of the collection answers its health check."""
        for url in self.routing.urls():
            try:
                if (await client.get(f"{url}/healthz", timeout=2)).status_code != 200:
                    return False
            except httpx.HTTPError:
                return False
        return True

    async def _heal(self, rid: str, client: httpx.AsyncClient) -> bool:
        """A run broke off (a Gym process died under it). Posting the same attempt again would start
        it over and redo completed work, so: wait until the environment answers, then recover every
        run that broke off meanwhile as its next attempt (tail seal, plan, restore, resume)."""
        self._interrupted.add(rid)
        async with self._heal_lock:
            if self._stop.is_set():
                return False
            if rid not in self._interrupted:
                return True  # another run's recovery took this one along
            give_up = time.monotonic() + self.heal_timeout_s
            while True:
                if await self._environments_up(client):
                    break
                if time.monotonic() > give_up or self._stop.is_set():
                    return False
                await asyncio.sleep(0.2)
            batch = sorted(self._interrupted)
            self._interrupted.clear()
            await self._recover(batch)
            self.summary.healed += len(batch)
            return True
