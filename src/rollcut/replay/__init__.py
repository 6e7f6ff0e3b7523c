"""Replay: folding events into session state as of a cut, and the one view of an attempt at its cut."""

from ._fold import (
    AgentFold,
    AgentSession,
    CallStatus,
    Fold,
    FoldRegistry,
    ModelCall,
    ModelFold,
    ModelSession,
    ResourceSession,
    ResourcesFold,
    ResourcesSessions,
    default_registry,
)
from ._lineage import Segment, inherited, lineage
from ._replay import AttemptState, Replayer, ReplayResult, RolloutState, replay
from ._view import AttemptView, AttemptViews, JournalGap, attempt_view, relay_journal
from ._work import DIVERGED_ON_REPLAY, WorkByGroup, WorkTally, count_work, count_work_by

__all__ = [
    "DIVERGED_ON_REPLAY",
    "AgentFold",
    "AgentSession",
    "AttemptState",
    "AttemptView",
    "AttemptViews",
    "CallStatus",
    "Fold",
    "FoldRegistry",
    "JournalGap",
    "ModelCall",
    "ModelFold",
    "ModelSession",
    "ReplayResult",
    "Replayer",
    "ResourceSession",
    "ResourcesFold",
    "ResourcesSessions",
    "RolloutState",
    "Segment",
    "WorkByGroup",
    "WorkTally",
    "attempt_view",
    "count_work",
    "count_work_by",
    "default_registry",
    "inherited",
    "lineage",
    "relay_journal",
    "replay",
]
