"""Opaque agents: agents rollcut cannot see inside, continued by journaling and replaying their egress.

The agent runs as its own program behind a relay (:class:`Relay`) that journals
every request and answer on the log and answers a restarted agent from that
journal; ``docs/opaque-agents.md`` says what is normalised, when a replay
diverges and what each declared :class:`Capability` promises.
"""

import pathlib as _pathlib

from ...replay import JournalGap
from ...sandbox._isolation import READ_ONLY_ROOT, Isolation
from .._capability import Capability, DivergencePolicy
from .._normalise import Normalise, canonical_body, normalised_route, request_digest
from ._exchange import Outgoing, RelayRun
from ._journal import lineage_journal
from ._launcher import MAX_AGENT_RESTARTS, OpaqueAgent, SandboxRef, SandboxSnapshot
from ._relay import MAX_JOURNALED_BYTES, Relay
from ._routes import create_opaque_app
from ._tree import TreeSnapshot

REFERENCE_AGENT = _pathlib.Path(__file__).with_name("reference_agent.py")
"""The reference opaque agent: a standalone program (the ``openai`` SDK and ``httpx``, nothing of
rollcut's) run as ``python REFERENCE_AGENT [--nonce]``."""
CLAUDE_CODE_AGENT = _pathlib.Path(__file__).with_name("claude_code_agent.py")
"""Claude Code (the ``claude`` CLI) as an opaque agent, run as ``python CLAUDE_CODE_AGENT --claude
PATH``: NeMo Gym's ``claude_code_agent`` behind rollcut's relay (docs/opaque-agents.md)."""

__all__ = [
    "CLAUDE_CODE_AGENT",
    "MAX_AGENT_RESTARTS",
    "MAX_JOURNALED_BYTES",
    "READ_ONLY_ROOT",
    "REFERENCE_AGENT",
    "Capability",
    "DivergencePolicy",
    "Isolation",
    "JournalGap",
    "Normalise",
    "OpaqueAgent",
    "Outgoing",
    "Relay",
    "RelayRun",
    "SandboxRef",
    "SandboxSnapshot",
    "TreeSnapshot",
    "canonical_body",
    "create_opaque_app",
    "lineage_journal",
    "normalised_route",
    "request_digest",
]
