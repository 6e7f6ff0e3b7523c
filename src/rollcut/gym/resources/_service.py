"""Stateful tool sessions with durable mutations and exact restore.

Sessions are keyed by (rollout_id, attempt). A tool call runs on a *draft* of
the session's state under the session lock; its ``resources.mutated`` event
(tool, arguments, result, revision, and a delta or the full state) is appended
before the reply, and only then does the draft become the state. A stale
attempt's call is refused by the server's fence and changes nothing.

Restore builds attempt N+1's session from the state at the cut of the attempt
live there, following its lineage (``rollcut.replay.lineage``) when that
attempt was itself a continuation (the environment's codec, plus deltas), for
the complete set of rollouts first, and activates them together only if every
one validates. The tool calls made after the agent's last boundary (revisions
above the boundary's recorded revision, or above the last tool call an opaque
agent's relay journaled) form the session's *replay queue*:
the continuing agent re-issues them, and they are answered from the log
instead of running twice. A re-issued call that differs from the logged one
is refused (``replay_mismatch``): the rollout must fall back to fresh
dispatch, never mix the two.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..._bounded import remember
from ..._errors import AdmissionClosedError, StaleAttemptError
from ..._tracing import TOOL_ATTRS, SpanKind, of_attempt, span
from ...bus import (
    AttemptOpened,
    EventLog,
    ResourcesMutated,
    ResourcesRetired,
    ResourcesSeeded,
    ResourcesSnapshot,
    ResourcesVerified,
    digest,
)
from ...participants import Participant, PrepareReport
from ...replay import AttemptView, AttemptViews
from ...sandbox import SnapshotError
from .._stats import RESOURCES_STATS, tally
from .._writes import Envelope, append_or_refuse, envelope
from ..wire import ErrorKind, GymError, Identity
from ._at_cut import NotContinuable, state_at_cut
from ._at_cut import settled as _settled
from ._env import Environment, ToolResult
from ._verdicts import Verdicts

__all__ = ["NotContinuable", "ResourcesService", "Session"]

T = TypeVar("T")


@contextlib.contextmanager
def _refused(what: str, args: Any) -> Iterator[None]:
    """An environment's hook refusing the caller's arguments (KeyError, TypeError, ValueError) is the
    caller's 400, never a 500: seeds, tool calls and verifications alike."""
    try:
        yield
    except (KeyError, TypeError, ValueError) as exc:
        raise GymError(ErrorKind.BAD_REQUEST, f"{what} {args!r:.300} refused: {exc!r}") from exc


@dataclass
class Session:
    ident: Identity
    state: Any
    revision: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    replay: deque[ResourcesMutated] = field(default_factory=deque)
    verified: dict[str, Any] | None = None
    retired: str | None = None
    journaled_verdict: ResourcesVerified | None = None  # the lineage's, answered again from the log


class ResourcesService:
    """Stateful tool sessions with durable mutations and exact restore."""

    def __init__(
        self,
        log: EventLog,
        env: Environment,
        *,
        instance: str,
        participant: Participant | None = None,
        owns: Callable[[str], bool] | None = None,
    ) -> None:
        self.log = log
        self.owns = owns or (lambda _rid: True)  # with several workers: the rollouts this one holds
        self.env = env
        env.bind(log)  # an environment that stores beside the log (a sandbox's blobs) reaches it here
        self.instance = instance
        self.participant = participant
        self.sessions: dict[Identity, Session] = {}
        self.views = AttemptViews(log)  # what each continued attempt starts from, read once
        self._retired: OrderedDict[str, str] = OrderedDict()  # rollouts that are over; bounded
        self._current: OrderedDict[str, int] = OrderedDict()  # rollout -> newest attempt seen open; bounded
        self.verdicts = Verdicts(env, self._append)
        self.stats = tally(RESOURCES_STATS)

    @property
    def verifying(self) -> int:
        """Verifications running now (a ``wait`` environment's prepare waits for them)."""
        return self.verdicts.running.count

    def _ev(self, ident: Identity) -> Envelope:
        return envelope("resources", self.instance, ident)

    async def _append(self, event: Any) -> int:
        return await append_or_refuse(self.log, event)

    def _admit(self) -> contextlib.AbstractAsyncContextManager[None]:
        if self.participant is None:
            return contextlib.nullcontext()
        return self.participant.gate.admit()

    async def _guarded(self, coro: Awaitable[T]) -> T:
        try:
            async with self._admit():
                return await coro
        except AdmissionClosedError as exc:
            raise GymError.admission_closed(exc) from exc

    # --- sessions -------------------------------------------------------------------------

    async def _logged_state(self, state: Any) -> bytes | None:
        if self.env.mode not in ("event_sourced", "exported"):
            return None
        blob: bytes = await _settled(self.env.export_state(state))
        return blob

    async def seed(self, ident: Identity, args: dict[str, Any]) -> dict[str, Any]:
        return await self._guarded(self._seed(ident, args))

    async def _seed(self, ident: Identity, args: dict[str, Any]) -> dict[str, Any]:
        existing = self.sessions.get(ident) or await self._restored(ident)
        if existing is not None:  # a continued attempt keeps its restored session; a repeat is idempotent
            return {"session": self.env.name, "revision": existing.revision, "restored": ident.attempt > 1}
        with _refused(f"{self.env.name}: seed", args):  # nothing made
            state = await _settled(self.env.seed(args))
        try:
            await self._append(
                ResourcesSeeded(
                    **self._ev(ident),
                    session=self.env.name,
                    env=self.env.name,
                    seed=args,
                    revision=0,
                    state=await self._logged_state(state),
                )
            )
        except BaseException:
            self.env.close(state)
            raise
        self._activate(Session(ident, state))
        return {"session": self.env.name, "revision": 0, "restored": False}

    async def _session(self, ident: Identity) -> Session:
        s = self.sessions.get(ident) or await self._restored(ident)
        if s is None and ident.attempt < self._current.get(ident.rollout_id, 0):
            raise GymError(
                ErrorKind.STALE_ATTEMPT,
                f"{ident.rollout_id}: attempt {ident.attempt} is stale "
                f"(attempt {self._current[ident.rollout_id]} is current); its session was dropped",
                rollout_id=ident.rollout_id,
                attempt=ident.attempt,
            )
        if s is None and self.env.implicit_sessions:
            await self._seed(ident, {})
            s = self.sessions.get(ident)
        if s is None:
            raise GymError(
                ErrorKind.NO_SESSION,
                f"no {self.env.name} session for {ident.rollout_id}/{ident.attempt}; "
                "call /seed_session first",
            )
        return s

    async def tool(self, ident: Identity, name: str, args: dict[str, Any]) -> dict[str, Any]:
        fn = self.env.tools().get(name)
        if fn is None:
            raise GymError(ErrorKind.UNKNOWN_TOOL, f"{self.env.name} has no tool {name!r}")
        attrs = {**TOOL_ATTRS, "gen_ai.tool.name": name, "rollcut.environment": self.env.name}
        with span(f"execute_tool {name}", SpanKind.SERVER, {**attrs, **of_attempt(ident)}) as s:
            try:
                out = await self._guarded(self._tool(ident, name, fn, args))
            except GymError as exc:  # a trace says why the call did not run (an old attempt's, late)
                s.set_attributes({"rollcut.disposition": "refused", "error.type": str(exc.kind)})
                raise
            s.set_attribute(
                "rollcut.disposition", "served_from_log" if out["served_from_log"] else "executed"
            )
            s.set_attribute("rollcut.revision", out["revision"])
            return out

    async def _tool(self, ident: Identity, name: str, fn: Any, args: dict[str, Any]) -> dict[str, Any]:
        s = await self._session(ident)
        async with s.lock:
            if s.replay:  # the continuing agent re-issues what the old attempt already did
                head = s.replay[0]
                if head.tool != name or head.arguments != args:
                    raise GymError(
                        ErrorKind.REPLAY_MISMATCH,
                        f"re-issued call {name}({args}) differs from logged {head.tool}({head.arguments}) "
                        f"at revision {head.revision}: fall back to fresh dispatch",
                    )
                s.replay.popleft()
                self.stats.inc("tool_calls_served_from_log")
                return {"result": head.result, "revision": head.revision, "served_from_log": True}
            draft = await _settled(self.env.copy(s.state))
            try:
                with _refused(f"{self.env.name}.{name}: arguments", args):  # on the draft: nothing changed
                    result, delta = await _settled(fn(draft, args))
                rev = s.revision + 1
                await self._record_mutation(ident, rev, name, args, (result, delta), draft)
            except BaseException:
                self.env.close(draft)  # never the session's: what it holds is as before the call
                raise
            old, s.state, s.revision = s.state, draft, rev
            if old is not draft:
                self.env.close(old)  # superseded (a sandbox's directory, a database's connection)
            self.stats.inc("tool_calls_executed")
            return {"result": result, "revision": rev, "served_from_log": False}

    async def _record_mutation(
        self, ident: Identity, rev: int, name: str, args: dict[str, Any], out: ToolResult, draft: Any
    ) -> None:
        """The call's ``resources.mutated``, durable before its reply and before the draft becomes the
        session's state (with that state, for an environment that logs states)."""
        result, delta = out
        await self._append(
            ResourcesMutated(
                **self._ev(ident),
                session=self.env.name,
                revision=rev,
                tool=name,
                arguments=args,
                result=result,
                delta=delta,
                state=await _settled(self.env.export_state(draft)) if self.env.state_in_events else None,
            )
        )

    async def verify(self, ident: Identity, args: dict[str, Any]) -> dict[str, Any]:
        return await self._guarded(self._verify(ident, args))

    async def _verify(self, ident: Identity, args: dict[str, Any]) -> dict[str, Any]:
        s = await self._session(ident)

        async def compute() -> dict[str, Any]:
            with _refused(f"{self.env.name}: verify arguments", args):
                verdict: dict[str, Any] = await _settled(self.env.verify(s.state, args))
            return verdict

        out, from_log = await self.verdicts.verdict(s, args, self._ev(ident), compute)
        s.verified = out
        self.stats.inc("verifications_served_from_log" if from_log else "verifications")
        return out

    async def close(self, ident: Identity) -> dict[str, Any]:
        s = await self._session(ident)
        passed = bool(s.verified and s.verified.get("passed"))
        reason = "completed" if passed else "failed_verification" if s.verified else "closed"
        await self._append(
            ResourcesRetired(**self._ev(ident), session=self.env.name, revision=s.revision, reason=reason)
        )
        s.retired = reason
        if passed or not s.verified:  # a failed verification stays for inspection until the rollout retires
            self.env.close(s.state)
            self.sessions.pop(ident, None)
        return {"retired": reason}

    def _activate(self, s: Session) -> None:
        # no await between this check and the insertion: a retirement seen before is refused here,
        # one seen after finds the session and drops it
        if s.ident.rollout_id in self._retired:
            self.env.close(s.state)
            raise GymError(ErrorKind.RETIRED, f"{s.ident.rollout_id} was retired")
        self.sessions.setdefault(s.ident, s)

    def retire(self, rollout_id: str, reason: str) -> int:
        """The rollout is over (accepted or retired): every attempt's session goes, including one
        kept for inspection after a failed verification."""
        remember(self._retired, rollout_id, reason, 100_000)
        self.views.forget(rollout_id)
        gone = [k for k in self.sessions if k.rollout_id == rollout_id]
        for k in gone:
            self.env.close(self.sessions.pop(k).state)
        self.stats.inc("sessions_retired", len(gone))
        return len(gone)

    # --- checkpoint hooks -----------------------------------------------------------------

    async def prepare(self, checkpoint_id: str) -> PrepareReport:
        """Aligned prepare: wait-mode verifications finish; exported envs snapshot every session.

        One session's failure is that rollout's, never the namespace's (docs/security.md): a state
        the environment says cannot be kept (``SnapshotError``: a link out of the tree) or that no
        record holds quarantines its rollout in this checkpoint, which then starts over from its
        input if restored, said why; a session whose attempt is no longer current (a newer one
        opened, the fence refuses its record) is dropped. A storage failure still fails the prepare:
        it says nothing about the rollout, and the next checkpoint tries again."""
        if self.env.verification == "wait":
            await self.verdicts.running.idle()
        quarantined: dict[str, str] = {}
        if self.env.mode == "exported":
            for s in list(self.sessions.values()):
                if s.retired:
                    continue
                async with s.lock:  # drained: no mutation is half-done
                    if s.retired or self.sessions.get(s.ident) is not s:
                        continue  # closed or retired while this waited for it: its state is gone
                    why = await self._snapshot(s)
                    if why:
                        quarantined[s.ident.rollout_id] = why
        unrepro = [f"{self.env.name}: restart_only"] if self.env.mode == "restart_only" else []
        return PrepareReport(unreproducible=unrepro, quarantined=quarantined)

    async def _snapshot(self, s: Session) -> str:
        """Log one session's snapshot; why it could not be (its rollout's quarantine), or ""."""
        try:
            blob = await _settled(self.env.export_state(s.state))
        except SnapshotError as exc:  # the environment's word that this state cannot be kept
            self.stats.inc("snapshots_refused")
            return f"{self.env.name} session at revision {s.revision} cannot be snapshotted: {exc}"[:300]
        try:
            await self._append(
                ResourcesSnapshot(
                    **self._ev(s.ident),
                    session=self.env.name,
                    revision=s.revision,
                    codec=self.env.name,
                    codec_version=self.env.codec_version,
                    state=blob,
                    digest=digest(blob),
                )
            )
        except GymError as exc:
            if exc.kind == ErrorKind.PAYLOAD_TOO_LARGE:  # a state no record holds: this rollout's
                self.stats.inc("snapshots_refused")
                return f"{self.env.name} session at revision {s.revision}: {exc}"[:300]
            if exc.kind not in (ErrorKind.STALE_ATTEMPT, ErrorKind.RETIRED):
                raise  # the bus or the store failed: this checkpoint fails, the next one tries again
            self._drop(s.ident)  # a newer attempt holds the rollout: this one's work is over
            return ""
        self.stats.inc("snapshots")
        return ""

    def _drop(self, ident: Identity) -> None:
        s = self.sessions.pop(ident, None)
        if s is not None:
            self.env.close(s.state)
            self.stats.inc("sessions_superseded")

    def close_all(self) -> None:
        """The server stops: every session's state goes (its log stays; a restore rebuilds it)."""
        for ident in list(self.sessions):
            self.env.close(self.sessions.pop(ident).state)

    def supersede(self, rollout_id: str, attempt: int) -> int:
        """Attempt ``attempt`` of the rollout opened: every older attempt's session goes at once
        (its calls are fenced off anyway; kept, it would only be snapshotted in vain)."""
        if attempt > self._current.get(rollout_id, 0):
            remember(self._current, rollout_id, attempt, 100_000)
        gone = [k for k in self.sessions if k.rollout_id == rollout_id and k.attempt < attempt]
        for k in gone:
            self._drop(k)
        return len(gone)

    async def restore(self, checkpoint_id: str, cut: int, rollouts: list[str] | None = None) -> None:
        """Rebuild every listed rollout's session this worker owns at the cut; activate all or none."""
        ids = rollouts if rollouts is not None else await self._rollouts_opened_from(cut)
        built: dict[Identity, Session] = {}
        for rid in filter(self.owns, ids):  # another worker builds (and logs) the rest
            view = await self.views.current(rid)
            if view is None or view.from_cut != cut:
                continue
            try:
                s = await self._build(view)
            except NotContinuable:
                continue  # this rollout goes to fresh dispatch; the others still restore
            if s is not None:
                built[s.ident] = s
        built = {k: v for k, v in built.items() if k.rollout_id not in self._retired}
        self.sessions.update(built)  # the activation: one step, after every session validated
        self.stats.inc("sessions_restored", len(built))

    async def _rollouts_opened_from(self, cut: int) -> list[str]:
        out = []
        async for s in self.log.read(start=cut):
            if isinstance(s.event, AttemptOpened) and s.event.from_cut == cut:
                out.append(s.event.rollout_id)
        return out

    async def _restored(self, ident: Identity) -> Session | None:
        """Lazily rebuild a continued attempt's session (e.g. in a replacement process)."""
        if ident.attempt < 2:
            return None
        try:
            view = await self.views.get(ident.rollout_id, ident.attempt)
        except StaleAttemptError:
            return None  # no session: its calls are refused (the fence refuses what it would write)
        if not view.continued:
            return None
        try:
            s = await self._build(view)
        except NotContinuable as exc:
            raise GymError(ErrorKind.NOT_CONTINUABLE, str(exc)) from exc
        if s is not None:
            self._activate(s)
            self.stats.inc("sessions_restored")
        return self.sessions.get(ident)

    async def _build(self, view: AttemptView) -> Session | None:
        """The session as it stood at the view's cut, as the view's attempt's; None if there was none.

        The view folded the lineage at the cut (``rollcut.replay.ResourceSession``): the state it
        inherited, the deltas since, and the replay queue of calls after the last boundary; what
        is left here is the environment's own codec."""
        ident = Identity(view.rollout_id, view.attempt)
        at_cut = view.resources.get(self.env.name)
        if at_cut is None:
            return None
        state = await state_at_cut(self.env, at_cut, ident.rollout_id)
        revision = at_cut.revision
        await self._append(
            ResourcesSeeded(
                **self._ev(ident),
                session=self.env.name,
                env=self.env.name,
                seed=at_cut.seed,
                revision=revision,
                state=await self._logged_state(state),
            )
        )
        return Session(
            ident,
            state,
            revision,
            replay=deque(view.replay_queues.get(self.env.name, ())),
            journaled_verdict=view.verdicts.get(self.env.name),
        )
