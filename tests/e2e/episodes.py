"""Driving single episodes through a process deployment: run, checkpoint, SIGKILL, continue.

The test process plays the framework: it dispatches, calls the environment server's ``/run``,
takes checkpoints with a real coordinator and opens continuation attempts, while every Gym server
is a separate process that the test kills with SIGKILL and starts again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from rollcut.bus import (
    AgentBoundary,
    BusConfig,
    Event,
    EventLog,
    ModelCallCompleted,
    ModelCallReused,
    ResourcesMutated,
    RolloutCompleted,
    load_credentials,
)
from rollcut.ledger import CheckpointRecord, Ledger
from rollcut.participants import Coordinator
from rollcut.tokens import LocalTokenStore

from ..helpers import until
from .conftest import Deployment

COUNTER = {
    "id": "count",
    "env": "counter",
    "prompt": "Count upwards from 3, then say the total.",  # its plan adds before its first boundary
    "seed": {"start": 3},
    "verify": {},
    "max_steps": 12,
}


class Episodes:
    def __init__(self, dep: Deployment, log: EventLog, ledger: Ledger, tokens: LocalTokenStore) -> None:
        self.dep, self.log, self.ledger, self.tokens = dep, log, ledger, tokens
        self.http = httpx.AsyncClient(timeout=180)
        self._runs: list[asyncio.Future[httpx.Response]] = []

    # --- the framework's side ---------------------------------------------------------

    async def reference(self, task: dict[str, Any], rollout_id: str = "reference") -> dict[str, Any]:
        """The same task, never interrupted: what every continuation must reproduce."""
        await self.log.dispatch(rollout_id, task, instance="collector")
        resp = await self.post_run(rollout_id, 1, task)
        assert resp.status_code == 200, resp.text
        return resp.json()

    async def post_run(self, rollout_id: str, attempt: int, task: dict[str, Any]) -> httpx.Response:
        return await self.http.post(
            f"{self.dep.stack[-1].url}/run",
            json=task,
            headers={"x-rollout-id": rollout_id, "x-rollout-attempt": str(attempt)},
        )

    def start_run(
        self, rollout_id: str, attempt: int, task: dict[str, Any]
    ) -> asyncio.Future[httpx.Response]:
        run = asyncio.ensure_future(self.post_run(rollout_id, attempt, task))
        self._runs.append(run)
        return run

    async def checkpoint(self) -> CheckpointRecord:
        return (await Coordinator(self.log, self.ledger, self.tokens).checkpoint(deadline_s=30)).record

    async def continue_from(self, rollout_id: str, record: CheckpointRecord) -> int:
        """Open the rollout's next attempt from the checkpoint's cut (as the collector's plan would)."""
        state = await self.log.fence_state(rollout_id)
        assert state is not None
        if state.open:
            return await self.log.supersede(
                rollout_id,
                state.attempt,
                instance="collector",
                checkpoint_id=record.checkpoint_id,
                from_cut=record.cut,
            )
        await self.log.open_attempt(
            rollout_id,
            state.attempt + 1,
            instance="collector",
            checkpoint_id=record.checkpoint_id,
            from_cut=record.cut,
        )
        return state.attempt + 1

    async def fresh_dispatch(self, rollout_id: str) -> int:
        """Open the rollout's next attempt from its input (the fallback when it cannot continue)."""
        state = await self.log.fence_state(rollout_id)
        assert state is not None
        if state.open:
            return await self.log.supersede(rollout_id, state.attempt, instance="collector", from_cut=0)
        await self.log.open_attempt(rollout_id, state.attempt + 1, instance="collector", from_cut=0)
        return state.attempt + 1

    async def runs_broken_off(self) -> None:
        """Wait for the framework's open requests, which a crash broke off."""
        for run in self._runs:
            with contextlib.suppress(httpx.HTTPError):
                await run
        self._runs.clear()

    async def crash(self) -> None:
        """SIGKILL every Gym process; the framework's open requests fail with them."""
        self.dep.crash()
        await self.runs_broken_off()

    # --- what the log says --------------------------------------------------------------

    async def events(self, rollout_id: str, attempt: int | None = None) -> list[tuple[int, Event]]:
        return [
            (s.seq, s.event)
            async for s in self.log.read(rollout_id=rollout_id, attempt=attempt)
            if s.event is not None
        ]

    async def boundaries(self, rollout_id: str, attempt: int, at_least: int) -> None:
        async def enough() -> bool:
            evs = await self.events(rollout_id, attempt)
            return sum(isinstance(e, AgentBoundary) for _, e in evs) >= at_least

        await until(enough, timeout=60, what=f"{at_least} boundaries of {rollout_id}/{attempt}")

    async def last_turn_below(self, rollout_id: str, cut: int) -> int:
        turns = [
            e.record.turn
            for seq, e in await self.events(rollout_id)
            if isinstance(e, AgentBoundary) and seq <= cut
        ]
        return turns[-1] if turns else 0

    async def first_turn(self, rollout_id: str, attempt: int) -> int:
        turns = [
            e.record.turn for _, e in await self.events(rollout_id, attempt) if isinstance(e, AgentBoundary)
        ]
        return turns[0]

    async def finished(self, rollout_id: str) -> bool:
        return any(isinstance(e, RolloutCompleted) for _, e in await self.events(rollout_id))

    async def generated(self, rollout_id: str) -> list[tuple[int, int, str]]:
        """(seq, attempt, request digest) of every model call the model server generated."""
        return [
            (seq, e.attempt, e.request_digest)
            for seq, e in await self.events(rollout_id)
            if isinstance(e, ModelCallCompleted)
        ]

    async def regenerated(self, rollout_id: str, at_or_below: int | None = None) -> list[str]:
        """Digests of calls completed (at or below a cut, if given) and then generated again."""
        calls = await self.generated(rollout_id)
        first: dict[str, int] = {}
        again = []
        for seq, _, dig in calls:
            if dig in first and (at_or_below is None or first[dig] <= at_or_below):
                again.append(dig)
            first.setdefault(dig, seq)
        return again

    async def reapplied(self, rollout_id: str, at_or_below: int | None = None) -> list[int]:
        """Resources revisions applied (at or below a cut, if given) and then applied again."""
        first: dict[int, int] = {}
        again = []
        for seq, e in await self.events(rollout_id):
            if isinstance(e, ResourcesMutated):
                if e.revision in first and (at_or_below is None or first[e.revision] <= at_or_below):
                    again.append(e.revision)
                first.setdefault(e.revision, seq)
        return again

    async def lineage_tokens(self, rollout_id: str) -> list[list[int]]:
        """The output tokens along the lineage of the rollout's last model call, oldest first."""
        receipts: dict[str, Any] = {}
        last = None
        for _, e in await self.events(rollout_id):
            if isinstance(e, ModelCallCompleted | ModelCallReused):
                receipts[e.call_id] = e.receipt
                last = e.call_id
        assert last is not None
        out = []
        for call in self.tokens.chain(last):
            receipt = receipts.get(call)
            assert receipt is not None, f"{call} in the lineage of {rollout_id} is not on its log"
            out.append(list(self.tokens.get(receipt).output_ids))
        return out

    async def stats(self) -> list[dict[str, Any]]:
        return [(await self.http.get(f"{p.url}/rollcut/stats")).json() for p in self.dep.stack]


@contextlib.asynccontextmanager
async def episodes(dep: Deployment) -> AsyncIterator[Episodes]:
    log = await EventLog.connect(
        BusConfig(url=dep.url, namespace="demo").as_role(load_credentials(dep.creds), "admin")
    )
    with Ledger(dep.root / "ledger") as ledger, LocalTokenStore(dep.root / "tokens") as tokens:
        e = Episodes(dep, log, ledger, tokens)
        try:
            yield e
        finally:
            await e.http.aclose()
            await log.close()
