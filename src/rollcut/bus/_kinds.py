"""One row per event kind: where it is stored, who writes it, what it refers to.

Folds, the ledger projector, reference validation and subject routing read
this table instead of each keeping an ``isinstance`` chain, so adding a kind
is: its struct in ``_events.py`` (and the ``AnyEvent`` union), one row here,
and a handler in the folds or projections where the kind means something.
An import-time check keeps the table and the union in step.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from enum import StrEnum

import msgspec

from . import _events as E
from ._events import Event, TokenReceipt

__all__ = ["KINDS", "CallStep", "KindSpec", "Lane", "handlers_by_kind", "kind_of", "spec_of"]


class Lane(StrEnum):
    """Which subject kind an event is stored on."""

    FENCE = "fence"
    """``rc.<ns>.fence.<rollout>``: the attempt lifecycle, written by collector and coordinator."""
    EVENTS = "events"
    """``rc.<ns>.ev.<rollout>.<attempt>.<component>[.<instance>]``: what one attempt did."""
    MARKER = "marker"
    """``rc.<ns>.mark.<lane>``: checkpoint markers and participant replies."""


class CallStep(StrEnum):
    """What a model-call event says about its call: it opens it, or ends it."""

    OPENS = "opens"
    ENDS = "ends"
    CUT = "cut"
    """A durable prefix: the call goes on, its prefix is bound."""


@dataclass(frozen=True)
class KindSpec:
    """How rollcut treats one event kind."""

    kind: str
    type: type[Event]
    lane: Lane
    writers: frozenset[str]
    """Components that may write it (the subject's component must be one of them)."""
    receipt: str | None = None
    """The field that holds a token receipt every checkpoint must find in the token store."""
    call: CallStep | None = None

    def receipt_of(self, event: Event) -> TokenReceipt | None:
        """The token receipt ``event`` refers to, if its kind carries one."""
        if self.receipt is None:
            return None
        value = getattr(event, self.receipt)
        return value if isinstance(value, TokenReceipt) else None


def kind_of(t: type[Event]) -> str:
    """The ``kind`` tag of an event struct."""
    info = msgspec.inspect.type_info(t)
    assert isinstance(info, msgspec.inspect.StructType)
    return str(info.tag)


_LIFECYCLE = frozenset({"collector", "coordinator"})
_MODEL = frozenset({"model"})
_RESOURCES = frozenset({"resources"})


def _spec(
    t: type[Event],
    lane: Lane,
    writers: frozenset[str],
    *,
    receipt: str | None = None,
    call: CallStep | None = None,
) -> KindSpec:
    return KindSpec(kind_of(t), t, lane, writers, receipt, call)


_TABLE = (
    _spec(E.RolloutDispatched, Lane.FENCE, _LIFECYCLE),
    _spec(E.AttemptOpened, Lane.FENCE, _LIFECYCLE),
    _spec(E.AttemptTombstoned, Lane.FENCE, _LIFECYCLE),
    _spec(E.RolloutRetired, Lane.FENCE, _LIFECYCLE),
    _spec(E.ModelCallAdmitted, Lane.EVENTS, _MODEL, call=CallStep.OPENS),
    _spec(E.ModelCallContinued, Lane.EVENTS, _MODEL, call=CallStep.OPENS, receipt="prefix_receipt"),
    _spec(E.ModelCallCompleted, Lane.EVENTS, _MODEL, call=CallStep.ENDS, receipt="receipt"),
    _spec(E.ModelCallReused, Lane.EVENTS, _MODEL, call=CallStep.ENDS, receipt="receipt"),
    _spec(E.ModelCallFailed, Lane.EVENTS, _MODEL, call=CallStep.ENDS),
    _spec(E.ModelCallExcluded, Lane.EVENTS, _MODEL, call=CallStep.ENDS),
    _spec(E.ModelCallPrefixCut, Lane.EVENTS, _MODEL, call=CallStep.CUT, receipt="receipt"),
    _spec(E.ResourcesSeeded, Lane.EVENTS, _RESOURCES),
    _spec(E.ResourcesMutated, Lane.EVENTS, _RESOURCES),
    _spec(E.ResourcesSnapshot, Lane.EVENTS, _RESOURCES),
    _spec(E.ResourcesRetired, Lane.EVENTS, _RESOURCES),
    _spec(E.ResourcesVerified, Lane.EVENTS, _RESOURCES),
    _spec(E.AttemptClaimed, Lane.EVENTS, frozenset({"agent"})),
    _spec(E.AgentBoundary, Lane.EVENTS, frozenset({"agent"})),
    _spec(E.AgentSandbox, Lane.EVENTS, frozenset({"agent"})),
    _spec(E.RelayExchange, Lane.EVENTS, frozenset({"agent"})),
    _spec(E.RelayReplayed, Lane.EVENTS, frozenset({"agent"})),
    _spec(E.RelayDiverged, Lane.EVENTS, frozenset({"agent"})),
    _spec(E.RolloutCompleted, Lane.EVENTS, frozenset({"environment"})),
    _spec(E.ResultAccepted, Lane.EVENTS, frozenset({"collector"})),
    _spec(E.CollectorLease, Lane.MARKER, frozenset({"collector"})),
    _spec(E.CheckpointPrepared, Lane.MARKER, frozenset({"coordinator"})),
    _spec(E.CheckpointSealed, Lane.MARKER, frozenset({"coordinator"})),
    _spec(E.CheckpointCommitted, Lane.MARKER, frozenset({"coordinator"})),
    _spec(E.CheckpointResumed, Lane.MARKER, frozenset({"coordinator"})),
    _spec(E.CheckpointAborted, Lane.MARKER, frozenset({"coordinator"})),
    _spec(E.ParticipantReplied, Lane.MARKER, frozenset({"model", "agent", "resources", "environment"})),
    _spec(
        E.ParticipantLeaseExpired,
        Lane.MARKER,
        frozenset({"model", "agent", "resources", "environment", "collector", "coordinator"}),
    ),
)

KINDS: dict[str, KindSpec] = {s.kind: s for s in _TABLE}
"""Every event kind this rollcut knows, by its ``kind`` tag."""

_BY_TYPE: dict[type[Event], KindSpec] = {s.type: s for s in _TABLE}

_union = set(typing.get_args(E.AnyEvent))
if _union != set(_BY_TYPE) or len(KINDS) != len(_TABLE):  # pragma: no cover - a developer's mistake
    raise ImportError(f"event kinds and the AnyEvent union disagree: {_union ^ set(_BY_TYPE)}")


def spec_of(event: Event) -> KindSpec:
    """The table row of an event."""
    return _BY_TYPE[type(event)]


H = typing.TypeVar("H")


def handlers_by_kind(handlers: dict[type[Event], H]) -> dict[type[Event], H]:
    """A dispatch table for a reader of the log (a fold, a projection, a tally): handlers keyed by
    the kind table's struct of each kind. A type the table does not know is refused at import, so a
    reader cannot silently handle nothing; one look-up per event, no ``isinstance`` chain."""
    unknown = [t.__name__ for t in handlers if t not in _BY_TYPE]
    if unknown:
        raise TypeError(f"not event kinds of the table: {', '.join(unknown)}")
    return {_BY_TYPE[t].type: h for t, h in handlers.items()}
