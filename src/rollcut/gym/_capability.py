"""What an opaque agent's runtime declares about its side effects, and what a divergence leads to.

Declared here, outside the opaque agent's package, because the server options
(``_options``) name them: a model or resources server reads its options
without loading the opaque agent (its relay, launcher and sandbox).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

__all__ = ["Capability", "DivergencePolicy"]

DivergencePolicy = Literal["fresh_dispatch", "go_live"]
"""What a divergent request leads to (``--on-divergence``)."""


class Capability(StrEnum):
    """What the runtime of an opaque agent guarantees about the agent's side effects."""

    REPLAYABLE_EGRESS = "replayable_egress"
    """Every side effect goes through the relay (model and tool calls over HTTP); the agent is
    deterministic given identical answers. A restarted agent is replayed from the journal."""
    SANDBOX_SNAPSHOT = "sandbox_snapshot"
    """Side effects outside the relay live in a sandbox the runtime snapshots at each checkpoint and
    restores before the replay (a :class:`SandboxSnapshot` provider, ``--sandbox``)."""
    RESTART_ONLY = "restart_only"
    """Nothing is guaranteed: a rollout that was cut off starts over from its input. The default."""
