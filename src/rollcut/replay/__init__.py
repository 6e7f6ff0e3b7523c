"""Replay: folding events into session state as of a cut."""

from ._fold import (
    AgentFold,
    AgentSession,
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

__all__ = [
    "AgentFold",
    "AgentSession",
    "AttemptState",
    "Fold",
    "FoldRegistry",
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
    "default_registry",
    "inherited",
    "lineage",
    "replay",
]
