"""Folds: how each component kind's events become session state.

A fold is a pair of pure functions, ``initial()`` and ``apply(state, stored)``.
The built-in session states are trees (``gc=False``): a replay of a long
history keeps many of them alive, and cyclic-GC scans of them would cost more
than the folding itself.
Live participants and replay use the same folds, which is what makes "the
state after replaying a prefix equals the live state at that point" a
property of the code rather than a hope. A component registers its fold once;
environments with their own codecs (issue: resources) register richer ones.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from .._errors import ConfigError
from ..bus import (
    AgentBoundary,
    AgentBoundaryRecord,
    Event,
    ModelCallAdmitted,
    ModelCallCompleted,
    ModelCallContinued,
    ModelCallExcluded,
    ModelCallFailed,
    ModelCallPrefixCut,
    ModelCallReused,
    RelayDiverged,
    RelayExchange,
    RelayReplayed,
    ResourcesMutated,
    ResourcesRetired,
    ResourcesSeeded,
    ResourcesSnapshot,
    StoredEvent,
    TokenReceipt,
    handlers_by_kind,
)

__all__ = [
    "AgentFold",
    "AgentSession",
    "Fold",
    "FoldRegistry",
    "ModelCall",
    "ModelFold",
    "ModelSession",
    "ResourceSession",
    "ResourcesFold",
    "ResourcesSessions",
    "default_registry",
]

S = TypeVar("S")


class Fold(Protocol, Generic[S]):
    """How one component's events become its session state: ``initial`` and ``apply``."""

    def initial(self) -> S: ...

    def apply(self, state: S, stored: StoredEvent) -> S: ...


class FoldRegistry:
    """Component kind -> fold. Events of unregistered components are kept out of state."""

    def __init__(self) -> None:
        self._folds: dict[str, Fold[Any]] = {}

    def register(self, component: str, fold: Fold[Any], *, replace: bool = False) -> None:
        if component in self._folds and not replace:
            raise ConfigError(f"a fold for component {component!r} is already registered")
        self._folds[component] = fold

    def get(self, component: str) -> Fold[Any] | None:
        return self._folds.get(component)

    def components(self) -> list[str]:
        return sorted(self._folds)

    def copy(self) -> FoldRegistry:
        new = FoldRegistry()
        new._folds = dict(self._folds)
        return new


# --- model ---------------------------------------------------------------------


_Step = Callable[[S, StoredEvent, Any], None]
"""One kind's handler in a fold: the state, the stored event, the event."""


class _TableFold(Generic[S]):
    """A fold that is a kind table: one handler per event kind it means something for (checked
    against the kind table at construction), every other kind left alone."""

    def __init__(self, state: Callable[[], S], handlers: dict[type[Event], _Step[S]]) -> None:
        self._new = state
        self._handlers = handlers_by_kind(handlers)

    def initial(self) -> S:
        return self._new()

    def apply(self, state: S, stored: StoredEvent) -> S:
        ev = stored.event
        handler = self._handlers.get(type(ev)) if ev is not None else None
        if handler is not None:
            handler(state, stored, ev)
        return state


class CallStatus(StrEnum):
    """Where a model call is, as its events left it (its values are what the log's readers print)."""

    ADMITTED = "admitted"
    CONTINUED = "continued"  # admitted as the continuation of an earlier attempt's cut
    COMPLETED = "completed"
    REUSED = "reused"  # answered from an earlier attempt's settled call
    PREFIX_CUT = "prefix_cut"  # its tokens so far made durable at a checkpoint
    FAILED = "failed"
    EXCLUDED = "excluded"  # running at a checkpoint on a backend that cannot cut: left out


SETTLED = frozenset({CallStatus.COMPLETED, CallStatus.REUSED})
"""The statuses of a model call that is answered for good (the one place this is said)."""
REUSABLE = SETTLED | {CallStatus.PREFIX_CUT}
"""The statuses whose tokens a later attempt takes (a prefix to continue, or the whole answer)."""


class ModelCall(msgspec.Struct, kw_only=True, gc=False):
    """One model call as replayed: status, receipt, and where it is on the log."""

    call_id: str
    status: CallStatus
    request_digest: str = ""
    parent_call_id: str | None = None
    receipt: TokenReceipt | None = None
    token_boundary: int | None = None
    admitted_seq: int = 0
    final_seq: int = 0
    response: Any = None
    finish_reason: str = "stop"  # how a completed (or reused) call's generation ended
    stop_sequence: str | None = None

    @property
    def settled(self) -> bool:
        """Answered, once and for all (generated to its end, or answered from an earlier attempt's
        answer): the same request is answered from it, never generated again."""
        return self.status in SETTLED

    @property
    def reusable(self) -> bool:
        """Its tokens can be taken by a later attempt: settled, or cut at a checkpoint (a prefix)."""
        return self.status in REUSABLE and self.receipt is not None


class ModelSession(msgspec.Struct, kw_only=True, gc=False):
    """An attempt's model calls."""

    calls: dict[str, ModelCall] = {}
    last_completed_call_id: str | None = None


class ModelFold(_TableFold[ModelSession]):
    """Each model call's status, receipt and response; handlers keyed by event kind."""

    def __init__(self) -> None:
        super().__init__(
            ModelSession,
            {
                ModelCallAdmitted: self._opened(CallStatus.ADMITTED),
                ModelCallContinued: self._opened(CallStatus.CONTINUED),
                ModelCallReused: self._reused,
                ModelCallCompleted: self._completed,
                ModelCallPrefixCut: self._prefix_cut,
                ModelCallFailed: self._ended(CallStatus.FAILED),
                ModelCallExcluded: self._ended(CallStatus.EXCLUDED),
            },
        )

    @staticmethod
    def _opened(status: CallStatus) -> Callable[[ModelSession, StoredEvent, Any], None]:
        """A call starts: admitted (generation ahead), or continued (from an earlier prefix)."""

        def opened(
            state: ModelSession, stored: StoredEvent, ev: ModelCallAdmitted | ModelCallContinued
        ) -> None:
            state.calls[ev.call_id] = ModelCall(
                call_id=ev.call_id,
                status=status,
                request_digest=ev.request_digest,
                parent_call_id=ev.parent_call_id,
                admitted_seq=stored.seq,
            )

        return opened

    @staticmethod
    def _reused(state: ModelSession, stored: StoredEvent, ev: ModelCallReused) -> None:
        state.calls[ev.call_id] = ModelCall(
            call_id=ev.call_id,
            status=CallStatus.REUSED,
            request_digest=ev.request_digest,
            parent_call_id=ev.parent_call_id,
            receipt=ev.receipt,
            response=ev.response,
            admitted_seq=stored.seq,
            final_seq=stored.seq,
            finish_reason=ev.finish_reason,
            stop_sequence=ev.stop_sequence,
        )
        state.last_completed_call_id = ev.call_id

    @staticmethod
    def _call(state: ModelSession, stored: StoredEvent, call_id: str) -> ModelCall:
        call = state.calls.get(call_id) or ModelCall(call_id=call_id, status=CallStatus.ADMITTED)
        state.calls[call_id] = call
        call.final_seq = stored.seq
        return call

    def _completed(self, state: ModelSession, stored: StoredEvent, ev: ModelCallCompleted) -> None:
        call = self._call(state, stored, ev.call_id)
        call.status, call.receipt, call.response = CallStatus.COMPLETED, ev.receipt, ev.response
        call.finish_reason, call.stop_sequence = ev.finish_reason, ev.stop_sequence
        call.request_digest, call.parent_call_id = ev.request_digest, ev.parent_call_id
        state.last_completed_call_id = ev.call_id

    def _prefix_cut(self, state: ModelSession, stored: StoredEvent, ev: ModelCallPrefixCut) -> None:
        done = state.calls.get(ev.call_id)
        if done is not None and done.settled:
            # a cut taken while the call was finishing, recorded after its completion: the completion
            # is final (continuing the prefix would generate again what the caller already got)
            return
        call = self._call(state, stored, ev.call_id)
        call.status, call.receipt, call.token_boundary = CallStatus.PREFIX_CUT, ev.receipt, ev.token_boundary

    def _ended(self, status: CallStatus) -> Callable[[ModelSession, StoredEvent, Any], None]:
        def end(state: ModelSession, stored: StoredEvent, ev: Any) -> None:
            self._call(state, stored, ev.call_id).status = status

        return end


# --- resources -------------------------------------------------------------------


class ResourceSession(msgspec.Struct, kw_only=True, gc=False):
    """One resources session as its events left it: revision, the latest full state, and the deltas
    since. The one fold of a session's state, for replay (one attempt) and for a continued
    attempt's view (the lineage at the cut: :attr:`~rollcut.replay.AttemptView.resources`)."""

    env: str = ""  # empty: never seeded on this stretch of the log (a retirement of an unknown one)
    revision: int = 0
    seed: Any = None  # the seeding that started the session (a continuation's re-seeding keeps it)
    state: bytes | None = None  # latest full state (seed, snapshot or mutation)
    state_revision: int = 0
    mutations: list[ResourcesMutated] = []  # since state_revision, for delta codecs
    retired: str | None = None
    last_seq: int = 0


class ResourcesSessions(msgspec.Struct, kw_only=True, gc=False):
    """An attempt's resources sessions, by name."""

    sessions: dict[str, ResourceSession] = {}


class ResourcesFold:
    """Tracks revisions and the latest full state; deltas are kept for the env's codec.

    A seeding at revision 0 (or of a session not seen yet) starts the session; a later one is a
    continuation re-based on the state it inherited (and keeps the deltas it came with if it
    carries no state)."""

    def __init__(self) -> None:
        self._handlers: dict[type[Event], Callable[[ResourceSession, Any], None]] = handlers_by_kind(
            {
                ResourcesSeeded: self._seeded,
                ResourcesMutated: self._mutated,
                ResourcesSnapshot: self._snapshot,
                ResourcesRetired: self._retired,
            }
        )

    def initial(self) -> ResourcesSessions:
        return ResourcesSessions()

    def apply(self, state: ResourcesSessions, stored: StoredEvent) -> ResourcesSessions:
        ev = stored.event
        handler = self._handlers.get(type(ev)) if ev is not None else None
        if handler is None:
            return state
        name: str = getattr(ev, "session", "")
        sess = state.sessions.get(name)
        if sess is None or (isinstance(ev, ResourcesSeeded) and ev.revision == 0):
            sess = state.sessions[name] = ResourceSession()
        sess.last_seq = stored.seq
        handler(sess, ev)
        return state

    @staticmethod
    def _seeded(sess: ResourceSession, ev: ResourcesSeeded) -> None:
        fresh = not sess.env
        if fresh:
            sess.env, sess.seed = ev.env, ev.seed
        sess.revision = ev.revision
        if fresh or ev.state is not None:
            sess.state, sess.state_revision, sess.mutations = ev.state, ev.revision, []

    @staticmethod
    def _mutated(sess: ResourceSession, ev: ResourcesMutated) -> None:
        sess.revision = ev.revision
        if ev.state is not None:
            sess.state, sess.state_revision, sess.mutations = ev.state, ev.revision, []
        else:
            sess.mutations.append(ev)

    @staticmethod
    def _snapshot(sess: ResourceSession, ev: ResourcesSnapshot) -> None:
        sess.revision = ev.revision
        sess.state, sess.state_revision, sess.mutations = ev.state, ev.revision, []

    @staticmethod
    def _retired(sess: ResourceSession, ev: ResourcesRetired) -> None:
        sess.retired = ev.reason


# --- agent --------------------------------------------------------------------


class AgentSession(msgspec.Struct, kw_only=True, gc=False):
    """An attempt's agent state: its last boundary and where it is on the log, and for an opaque
    agent what its relay did: exchanges journaled, requests answered from the lineage's journal,
    and each divergence (which request, what was expected, what the policy did and why)."""

    boundary: AgentBoundaryRecord | None = None
    boundary_seq: int = 0
    boundaries: int = 0
    relay_exchanges: int = 0
    relay_replayed: int = 0
    relay_diverged: list[RelayDiverged] = []


class AgentFold(_TableFold[AgentSession]):
    """Folds agent boundaries into the last boundary of an attempt, and counts its relay's work."""

    def __init__(self) -> None:
        super().__init__(
            AgentSession,
            {
                AgentBoundary: self._boundary,
                RelayExchange: self._counted("relay_exchanges"),
                RelayReplayed: self._counted("relay_replayed"),
                RelayDiverged: self._diverged,
            },
        )

    @staticmethod
    def _boundary(state: AgentSession, stored: StoredEvent, ev: AgentBoundary) -> None:
        state.boundary, state.boundary_seq = ev.record, stored.seq
        state.boundaries += 1

    @staticmethod
    def _counted(field: str) -> Callable[[AgentSession, StoredEvent, Any], None]:
        def count(state: AgentSession, stored: StoredEvent, ev: Any) -> None:
            setattr(state, field, getattr(state, field) + 1)

        return count

    @staticmethod
    def _diverged(state: AgentSession, stored: StoredEvent, ev: RelayDiverged) -> None:
        state.relay_diverged.append(ev)


def default_registry() -> FoldRegistry:
    """The built-in folds: model, resources and agent."""
    reg = FoldRegistry()
    reg.register("model", ModelFold())
    reg.register("resources", ResourcesFold())
    reg.register("agent", AgentFold())
    return reg
