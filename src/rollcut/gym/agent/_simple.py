"""The Simple Agent: Gym's /run loop, with boundaries, parking and continuation.

Loop: seed the resources session, call the policy model, run each tool call
against the resources server, append the outputs, until the model answers
without tool calls or ``max_steps``; then ``/verify`` and close.

After every completed nonterminal turn it appends an ``agent.boundary``
(output items, usage, last committed model call, resources revisions, agent
state). On an aligned prepare it parks at the next boundary, never cutting an
operation midway, and goes on when the checkpoint ends.

Continuation: attempt N+1 opened from a cut restarts from N's last boundary
below the cut. The operations of the unfinished turn are re-issued: the model
server answers them from the log (same request digest), the resources server
from its replay queue. If a re-issued operation differs from the logged one
(the agent changed, or is not deterministic) the run stops with
``fresh_dispatch`` and says why. It never mixes the two.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..._tracing import INVOKE_ATTRS, SpanKind, of_attempt, span
from ...bus import AgentBoundary, AgentBoundaryRecord, EventLog
from ...participants import Participant, PrepareReport
from ...replay import AttemptViews
from .._attempts import FreshDispatchNeeded, claim_attempt, post_waiting, view_of
from .._client import gym_client
from .._stats import AGENT_STATS, tally
from .._tasks import check_task
from .._writes import append_or_refuse
from ..wire import ErrorKind, GymError, Identity
from ._chat import run_chat
from ._loop import AgentLoop, RunContext, Upstreams
from ._responses import run_responses, serve_responses

__all__ = ["Run", "SimpleAgent"]

SYSTEM = "You are a careful agent. Use the tools, then answer."


@dataclass
class Run:
    ident: Identity
    parked: bool = False
    calling: bool = False  # awaiting the policy model or a tool: that server's prepare settles the call
    release: asyncio.Event = field(default_factory=asyncio.Event)
    retired: str | None = None


class SimpleAgent:
    """Gym's Simple Agent loop with boundaries, parking and continuation."""

    def __init__(
        self,
        log: EventLog,
        *,
        instance: str,
        model_url: str,
        resources: dict[str, str],
        participant: Participant | None = None,
        http: httpx.AsyncClient | None = None,
        system_prompt: str = SYSTEM,
        admission_wait_s: float = 120.0,
    ) -> None:
        self.log = log
        self.instance = instance
        self.model_url = model_url
        self.resources = resources
        self.participant = participant
        self.http = http or gym_client(120)
        self.system_prompt = system_prompt
        self.admission_wait_s = admission_wait_s
        self.upstreams = Upstreams(model_url, resources, self.http, system_prompt)
        self._runs: dict[Identity, Run] = {}
        self.views = AttemptViews(log)  # where each continued attempt starts, read once
        self._park_for: str | None = None
        self._all_parked = asyncio.Event()
        self.stats = tally(AGENT_STATS)

    # --- parking (checkpoint hooks) ----------------------------------------------------

    def _check_all_parked(self) -> None:
        if self._park_for is not None and all(r.parked or r.calling for r in self._runs.values()):
            self._all_parked.set()

    async def prepare(self, checkpoint_id: str) -> PrepareReport:
        """Prepare: every running loop parks at its next boundary (or finishes), except one awaiting
        the policy model or a tool, which is settled as it is. A model call gets its own disposition
        in the model server's prepare (completed, or cut at a durable prefix); a tool call's mutation
        is on the log below the cut or not (an exported session's server drains it first). A
        continuation re-issues either from the loop's last boundary: reused or continued from the
        prefix, served from the log, or run again if it landed after the cut. Waiting for them
        instead would stand the whole collection still for the longest generation in flight
        (seconds to minutes on a real engine) or the slowest tool, and leave generation cuts
        nothing to cut. A loop that goes on after its call answers parks at its next boundary."""
        self._park_for = checkpoint_id
        self._all_parked.clear()
        self._check_all_parked()
        await self._all_parked.wait()
        return PrepareReport()

    def release(self, checkpoint_id: str) -> None:
        self._park_for = None
        for r in self._runs.values():
            r.parked = False
            r.release.set()

    async def restore(self, checkpoint_id: str, cut: int) -> None:
        return None  # each continued run rebuilds itself from the log

    def retire(self, rollout_id: str, reason: str) -> None:
        """A retired rollout's loop stops at its next step (a parked one at once)."""
        if reason == "accepted":
            return  # its run has already ended
        for run in self._runs.values():
            if run.ident.rollout_id == rollout_id:
                run.retired = reason
                run.release.set()

    def _check_retired(self, run: Run) -> None:
        if run.retired is not None:
            self.stats.inc("runs_retired")
            raise GymError(ErrorKind.RETIRED, f"{run.ident.rollout_id} was retired: {run.retired}")

    async def _maybe_park(self, run: Run) -> None:
        if self._park_for is None:
            return
        run.parked, run.release = True, asyncio.Event()
        self.stats.inc("parks")
        self._check_all_parked()
        await run.release.wait()
        self._check_retired(run)

    # --- the loop ------------------------------------------------------------------------

    async def _send(
        self, url: str, ident: Identity, body: dict[str, Any], cookies: dict[str, str] | None = None
    ) -> httpx.Response:
        """POST with identity (and a session's cookies), waiting out a checkpoint's closed admission;
        a refusal the rollout cannot continue past becomes FreshDispatchNeeded. A run awaiting the
        policy model or a tool counts as parked: that server's prepare settles its call."""
        run = self._runs.get(ident)
        if run is None:
            return await self._send_waiting(url, ident, body, cookies)
        run.calling = True
        self._check_all_parked()
        try:
            return await self._send_waiting(url, ident, body, cookies)
        finally:
            run.calling = False

    async def _send_waiting(
        self, url: str, ident: Identity, body: dict[str, Any], cookies: dict[str, str] | None
    ) -> httpx.Response:
        def waited() -> None:
            self.stats.inc("admission_waits")

        return await post_waiting(
            self.http, url, ident, body, wait_s=self.admission_wait_s, on_wait=waited, cookies=cookies
        )

    async def boundary(self, run: Run, record: AgentBoundaryRecord) -> None:
        """A completed nonterminal turn: its boundary on the log, then park here if a checkpoint asks."""
        ident = run.ident
        await append_or_refuse(  # retired or superseded meanwhile: the run's answer is a 409, not a 500
            self.log,
            AgentBoundary(
                component="agent",
                instance=self.instance,
                rollout_id=ident.rollout_id,
                attempt=ident.attempt,
                record=record,
            ),
        )
        self.stats.inc("boundaries")
        await self._maybe_park(run)

    def _count(self, name: str) -> None:
        self.stats.inc(name)

    async def _claim(self, ident: Identity) -> None:
        """Custody's first step of an attempt: it runs once (:func:`claim_attempt`)."""
        await claim_attempt(self.log, self.instance, ident, running_here=ident in self._runs)

    async def _start_of(self, ident: Identity) -> AgentBoundaryRecord | None:
        """Where the attempt starts: its lineage's last boundary at its cut (None: from its input)."""
        return (await view_of(self.views, ident)).boundary

    async def _context(self, run: Run) -> RunContext:
        ident = run.ident
        start = await self._start_of(ident)

        async def send(url: str, body: dict[str, Any], cookies: dict[str, str] | None) -> httpx.Response:
            return await self._send(url, ident, body, cookies)

        async def boundary(record: AgentBoundaryRecord) -> None:
            await self.boundary(run, record)

        def check_retired() -> None:
            self._check_retired(run)

        return RunContext(ident, start, self.upstreams, send, boundary, check_retired, self._count)

    async def run(self, ident: Identity, task: dict[str, Any]) -> dict[str, Any]:
        """``/run``: one attempt of a task row (rollcut's or NeMo Gym's), seeded, run and verified."""
        check_task(task, list(self.resources))
        loop: AgentLoop = run_responses if "responses_create_params" in task else run_chat
        return await self._attempt(ident, task, loop)

    async def responses(self, ident: Identity, params: dict[str, Any]) -> dict[str, Any]:
        """NeMo Gym's agent ``/v1/responses``: the loop alone, in a session the caller seeded."""
        return await self._attempt(ident, params, serve_responses)

    async def _attempt(self, ident: Identity, task: dict[str, Any], loop: AgentLoop) -> dict[str, Any]:
        await self._claim(ident)
        run = Run(ident)
        self._runs[ident] = run
        self.stats.inc("runs_started")
        try:
            ctx = await self._context(run)
            attrs = {**INVOKE_ATTRS, "gen_ai.agent.name": "simple", **of_attempt(ident)}
            attrs["rollcut.continued"] = ctx.start is not None
            with span("invoke_agent simple", SpanKind.SERVER, attrs):
                return await loop(ctx, task)
        except FreshDispatchNeeded:
            self.stats.inc("fresh_dispatch")
            raise
        finally:
            self._runs.pop(ident, None)
            self.views.forget(ident.rollout_id)  # an attempt runs once: its view is not asked again
            self._check_all_parked()
