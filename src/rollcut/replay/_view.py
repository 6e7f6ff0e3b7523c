"""One view of an attempt: what a continued attempt starts from, read once from the log.

Every participant that continues an attempt needs the same facts about it: the
cut it continues from, the chain of attempts (the lineage) whose events make up
its state there, each component's state at that cut, and the model calls an
earlier attempt settled after the cut but before the fence moved on. They used
to be rebuilt four ways (the resources server, the Simple Agent, the model
server and the opaque relay each folded the log by hand); now
:func:`attempt_view` reads the rollout once, folds it with the same folds
:func:`~rollcut.replay.replay` uses plus the lineage folds below, and every
participant builds its restore and its continuation from the result.
:class:`AttemptViews` caches one view per attempt for the attempt's life (a
view never changes: an attempt's cut is fixed when it opens).

A stale attempt (one the fence has moved past) has no view: asking for one
raises :class:`~rollcut.StaleAttemptError`, which the servers turn into their
``409 stale_attempt`` in one place.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from itertools import groupby
from typing import Any

from .. import bus
from .._errors import RollcutError, StaleAttemptError
from ..bus import AgentBoundaryRecord, Event, EventLog, RolloutEvent, StoredEvent, handlers_by_kind
from ._fold import (
    AgentFold,
    AgentSession,
    CallStatus,
    ModelCall,
    ModelFold,
    ModelSession,
    ResourceSession,
    ResourcesFold,
)
from ._lineage import Chain, Segment
from ._replay import Replayer, RolloutState

__all__ = ["AttemptView", "AttemptViews", "JournalGap", "attempt_view", "relay_journal"]


class JournalGap(RollcutError):
    """The lineage's journal has a hole: it cannot be replayed in order."""

    rollout_id: str | None = None
    attempt: int | None = None


class _LineageFold:
    """Folds the lineage's events (stream order) into resources sessions (by replay's own fold),
    each session's tool calls to answer from the log, the boundary revisions and the relay's
    journal. Handlers are keyed by the kind table's tags, as the folds are.

    The replay queue of a session is its tool calls after the agent's last boundary (or after the
    last tool call an opaque agent's relay journaled): the continuing agent re-issues them and is
    answered from the log."""

    def __init__(self) -> None:
        self._fold = ResourcesFold()
        self.resources = self._fold.initial()
        self.calls: dict[str, list[bus.ResourcesMutated]] = {}
        self.replay_queues: dict[str, list[bus.ResourcesMutated]] = {}
        self.verdicts: dict[str, bus.ResourcesVerified] = {}
        self.boundary: dict[str, int] = {}
        self.exchanges: list[bus.RelayExchange] = []
        self.sandbox: bus.AgentSandbox | None = None
        self._handlers: dict[type[Event], Callable[[Any], None]] = handlers_by_kind(
            {
                bus.ResourcesMutated: self._mutated,
                bus.ResourcesVerified: self._verified,
                bus.AgentBoundary: self._boundary,
                bus.RelayExchange: self._exchange,
                bus.AgentSandbox: self._sandbox,
            }
        )

    def apply(self, stored: StoredEvent) -> None:
        ev = stored.event
        name: str | None = getattr(ev, "session", None)
        before = self.resources.sessions.get(name) if name is not None else None
        self._fold.apply(self.resources, stored)
        if name is not None and self.resources.sessions.get(name) is not before:
            self.calls[name] = []  # the fold started the session (again): its calls start with it
            self.verdicts.pop(name, None)
        handler = self._handlers.get(type(ev)) if ev is not None else None
        if handler is not None:
            handler(ev)

    def _mutated(self, ev: bus.ResourcesMutated) -> None:
        if self.resources.sessions[ev.session].env:  # a call of a session the lineage seeded
            self.calls[ev.session].append(ev)

    def _verified(self, ev: bus.ResourcesVerified) -> None:
        self.verdicts[ev.session] = ev  # the latest: a later call moved the session past an older one

    def _boundary(self, ev: bus.AgentBoundary) -> None:
        self.boundary = dict(ev.record.resources_revisions)

    def _exchange(self, ev: bus.RelayExchange) -> None:
        self.exchanges.append(ev)
        if ev.env and ev.revision is not None:
            # an opaque agent's relay answers every journaled tool call itself: the queue starts
            # after the last one it holds
            self.boundary[ev.env] = max(self.boundary.get(ev.env, 0), ev.revision)

    def _sandbox(self, ev: bus.AgentSandbox) -> None:
        self.sandbox = ev

    def finish(self) -> dict[str, ResourceSession]:
        """The sessions the lineage seeded, their replay queues made."""
        seeded = {name: s for name, s in self.resources.sessions.items() if s.env}
        for name in seeded:
            done = self.boundary.get(name, 0)
            self.replay_queues[name] = [m for m in self.calls.get(name, ()) if m.revision > done]
        return seeded


def relay_journal(rollout_id: str, exchanges: list[bus.RelayExchange]) -> list[bus.RelayExchange]:
    """The exchanges a continuation replays, ``n`` = 1, 2, … in order, from a lineage's exchanges in
    stream order; :class:`JournalGap` where a hole (a lost record) stops it.

    A successor numbers its own exchanges on from what it inherited, so the journal is the
    concatenation, except where a successor *went live* at a divergence (``go_live``): its exchange
    ``n`` replaces the inherited ``n`` and everything after it."""
    journal: list[bus.RelayExchange] = []
    # the chain's attempts ascend; within one, concurrent exchanges may be stored out of their order
    for _, own in groupby(exchanges, key=lambda e: e.attempt):
        for ev in sorted(own, key=lambda e: e.n):
            if ev.n > len(journal) + 1:
                raise JournalGap(
                    f"{rollout_id}: exchange {ev.n} of attempt {ev.attempt} follows {len(journal)}",
                    rollout_id=rollout_id,
                    attempt=ev.attempt,
                )
            del journal[ev.n - 1 :]
            journal.append(ev)
    return journal


@dataclass
class AttemptView:
    """What attempt ``attempt`` of ``rollout_id`` starts from.

    ``from_cut`` 0 means it starts from its input (attempt 1, or a fresh dispatch), and everything
    else is empty. Otherwise: ``lineage`` the chain of segments at the cut, ``events`` the
    lineage's events in stream order, ``earlier`` each earlier attempt as replayed up to the cut,
    and ``after_cut`` the model calls earlier attempts settled between the cut and the fence's
    move to this attempt (a generation in flight at the seal finishes there)."""

    rollout_id: str
    attempt: int
    from_cut: int = 0
    opened_seq: int = 0
    lineage: list[Segment] = field(default_factory=list)
    events: list[StoredEvent] = field(default_factory=list)
    earlier: RolloutState | None = None
    after_cut: dict[int, ModelSession] = field(default_factory=dict)
    agent: AgentSession = field(default_factory=AgentSession)
    resources: dict[str, ResourceSession] = field(default_factory=dict)
    """Each resources session as the lineage left it at the cut (replay's fold of it)."""
    replay_queues: dict[str, list[bus.ResourcesMutated]] = field(default_factory=dict)
    """Each session's tool calls a continuing agent re-issues, answered from the log."""
    verdicts: dict[str, bus.ResourcesVerified] = field(default_factory=dict)
    """Each session's last journaled verification: asked again at its revision with the same
    request, it is answered from the log, not computed again."""
    exchanges: list[bus.RelayExchange] = field(default_factory=list)
    sandbox: bus.AgentSandbox | None = None
    """The lineage's last opaque-agent sandbox snapshot at the cut (``agent.sandbox``), if any."""
    corrupt_seqs: list[int] = field(default_factory=list)

    @property
    def continued(self) -> bool:
        """Whether this attempt continues from a cut (not from its input)."""
        return self.from_cut > 0

    @property
    def boundary(self) -> AgentBoundaryRecord | None:
        """The lineage's last agent boundary at the cut; None if it starts from its input.
        A continued attempt whose lineage reached no boundary restarts from turn 0."""
        if not self.continued:
            return None
        return self.agent.boundary or AgentBoundaryRecord(turn=0, output_items=[])

    def journal(self) -> list[bus.RelayExchange]:
        """The relay exchanges a continuation replays, in order; :class:`JournalGap` on a hole."""
        return relay_journal(self.rollout_id, self.exchanges)

    @cached_property
    def reusable_calls(self) -> dict[str, tuple[int, ModelCall]]:
        """Request digest -> (attempt, call) of every call an earlier attempt completed, reused or
        cut below the cut, then those it completed after the cut before the fence moved (a call
        settled there is a finished sample for its exact request; one the fence refused is not on
        the log). A later attempt's entry for the same digest wins."""
        out: dict[str, tuple[int, ModelCall]] = {}
        attempts = self.earlier.attempts if self.earlier is not None else {}
        for n, a in sorted(attempts.items()):
            model = a.sessions.get("model") if n < self.attempt else None
            for call in model.calls.values() if model is not None else ():
                if call.reusable:
                    out[call.request_digest] = (n, call)
        for n, session in sorted(self.after_cut.items()):
            for call in session.calls.values():
                have = out.get(call.request_digest)
                settled = have is not None and have[1].settled
                if call.status is CallStatus.COMPLETED and call.receipt is not None and not settled:
                    out[call.request_digest] = (n, call)
        return out

    @cached_property
    def lost_calls(self) -> frozenset[str]:
        """Request digests of calls earlier attempts admitted, up to the cut or between it and the
        fence's move, and left with nothing to reuse (in flight when the attempt broke off, and not
        cut): the same call now is generated again, work the crash cost
        (``rollcut_model_calls_regenerated_total``)."""
        attempts = self.earlier.attempts if self.earlier is not None else {}
        sessions = [a.sessions.get("model") for n, a in attempts.items() if n < self.attempt]
        sessions += list(self.after_cut.values())
        lost = {
            call.request_digest
            for model in sessions
            if model is not None
            for call in model.calls.values()
            if not call.reusable
        }
        return frozenset(lost - set(self.reusable_calls))

    @cached_property
    def last_call_id(self) -> str | None:
        """The lineage's last settled model call at the cut: the parent of this attempt's first."""
        last: tuple[int, str] = (0, "")
        attempts = self.earlier.attempts if self.earlier is not None else {}
        for seg in self.lineage:
            model = attempts[seg.attempt].sessions.get("model") if seg.attempt in attempts else None
            for call in model.calls.values() if model is not None else ():
                done = call.settled and call.final_seq <= seg.up_to
                if done and call.final_seq > last[0]:
                    last = (call.final_seq, call.call_id)
        return last[1] or None


def _current(ev: Any) -> int | None:
    if isinstance(ev, bus.AttemptOpened):
        return ev.attempt
    return 1 if isinstance(ev, bus.RolloutDispatched) else None


async def attempt_view(log: EventLog, rollout_id: str, attempt: int) -> AttemptView:
    """The view of ``(rollout_id, attempt)``: one read of the rollout up to where the attempt opened.

    Raises :class:`~rollcut.StaleAttemptError` for an attempt above 1 that is not the fence's
    current one: its run would only write what the server refuses."""
    view = AttemptView(rollout_id, attempt)
    if attempt < 2:
        return view
    last = await log.last_on(log.subjects.fence(rollout_id))
    opened = last.event if last is not None else None
    if not isinstance(opened, bus.AttemptOpened) or opened.attempt != attempt:
        raise StaleAttemptError(rollout_id, attempt, _current(opened))
    assert last is not None  # it holds ``opened``
    view.from_cut, view.opened_seq = opened.from_cut, last.seq
    if not view.from_cut and not opened.reuse_completed:
        return view  # from its input, every earlier call set aside (a restart measured as one)
    cut = view.from_cut
    replayer = Replayer(log.subjects)
    chain = Chain()
    fold = ModelFold()
    async for page in log.read_pages(rollout_id=rollout_id, up_to=max(cut, view.opened_seq), strict=False):
        for s in page:
            ev = s.event
            if s.seq <= cut:
                replayer.apply(s)
                chain.add(s)
                if ev is None:
                    view.corrupt_seqs.append(s.seq)
            elif isinstance(ev, RolloutEvent) and ev.component == "model" and ev.attempt < attempt:
                # an earlier attempt's model events past the cut, folded as replay does
                fold.apply(view.after_cut.setdefault(ev.attempt, fold.initial()), s)
    view.earlier = replayer.result.rollouts.get(rollout_id)
    view.lineage, view.events = chain.at(cut)
    agent, lineage_fold = AgentFold(), _LineageFold()
    for s in view.events:
        ev = s.event
        assert isinstance(ev, RolloutEvent)
        if ev.component == "agent":
            view.agent = agent.apply(view.agent, s)
        lineage_fold.apply(s)
    view.resources = lineage_fold.finish()
    view.replay_queues = lineage_fold.replay_queues
    view.verdicts = lineage_fold.verdicts
    view.exchanges = lineage_fold.exchanges
    view.sandbox = lineage_fold.sandbox
    return view


class AttemptViews:
    """One :class:`AttemptView` per attempt, read once and kept for the attempt's life (bounded).

    Concurrent askers for the same attempt share one read. A stale attempt is not cached: the
    next ask looks at the fence again."""

    def __init__(self, log: EventLog, *, size: int = 4096) -> None:
        self.log = log
        self.size = size
        self._views: OrderedDict[tuple[str, int], asyncio.Future[AttemptView]] = OrderedDict()
        self.reads = 0

    async def get(self, rollout_id: str, attempt: int) -> AttemptView:
        """The view of ``(rollout_id, attempt)``; see :func:`attempt_view`."""
        key = (rollout_id, attempt)
        fut = self._views.get(key)
        if fut is None:
            fut = asyncio.ensure_future(self._read(rollout_id, attempt))
            self._views[key] = fut
            while len(self._views) > self.size:
                self._views.popitem(last=False)
        try:
            return await asyncio.shield(fut)
        except BaseException:
            if fut.done() and self._views.get(key) is fut:
                del self._views[key]  # a failed read (or a stale attempt) is asked again next time
            raise

    async def _read(self, rollout_id: str, attempt: int) -> AttemptView:
        self.reads += 1
        return await attempt_view(self.log, rollout_id, attempt)

    async def current(self, rollout_id: str) -> AttemptView | None:
        """The view of the rollout's open attempt if it is a continuation (else None)."""
        last = await self.log.last_on(self.log.subjects.fence(rollout_id))
        ev = last.event if last is not None else None
        if not isinstance(ev, bus.AttemptOpened):
            return None
        try:
            return await self.get(rollout_id, ev.attempt)
        except StaleAttemptError:
            return None  # the fence moved again meanwhile

    def forget(self, rollout_id: str) -> None:
        """Drop every view of a rollout that is over."""
        for key in [k for k in self._views if k[0] == rollout_id]:
            del self._views[key]

    def clear(self) -> None:
        """Drop every view (a restore: the next ask reads the log again)."""
        self._views.clear()
