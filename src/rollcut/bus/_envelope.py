"""The envelope every event shares, the identifier types, and the payload records events carry.

Split from :mod:`rollcut.bus._events` (the kinds and their union), which
re-exports all of it: a reader imports the schema from one place.
"""

from __future__ import annotations

import base64
import os
import time
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct, field

__all__ = [
    "SCHEMA_VERSION",
    "AgentBoundaryRecord",
    "Attempt",
    "CheckpointEvent",
    "Component",
    "Event",
    "HexDigest",
    "Revision",
    "RolloutEvent",
    "Seq",
    "Token",
    "TokenReceipt",
    "new_event_id",
]

SCHEMA_VERSION = 1
"""The event schema version this rollcut writes."""

# An id that may become a subject token or header value. Decoding bounds its
# length; writing also checks the alphabet [A-Za-z0-9_-] (see _strict.py).
Token = Annotated[str, Meta(min_length=1, max_length=128, extra={"rollcut": "token"})]
Attempt = Annotated[int, Meta(ge=1)]
Revision = Annotated[int, Meta(ge=0)]
Seq = Annotated[int, Meta(ge=0)]
HexDigest = Annotated[str, Meta(min_length=16, max_length=128, extra={"rollcut": "hex"})]

Component = Literal["model", "agent", "resources", "environment", "collector", "coordinator"]
"""The kinds of writer a subject can name."""


def new_event_id() -> str:
    """A random id (96 bits, url-safe base64: 16 characters, a header line of 30 bytes); it doubles
    as the JetStream ``Nats-Msg-Id`` for dedupe."""
    return base64.urlsafe_b64encode(os.urandom(12)).decode()


class Event(Struct, frozen=True, kw_only=True, tag_field="kind", gc=False):
    """Envelope shared by every event.

    ``gc=False``: events are trees (decoded msgpack cannot form cycles), so
    the garbage collector need not track them; a long replay keeps hundreds of
    thousands alive and GC scans would otherwise cost more than decoding.
    """

    component: Component
    instance: Token
    schema_version: Annotated[int, Meta(ge=1)] = SCHEMA_VERSION
    event_id: Token = field(default_factory=new_event_id)
    ts: float = field(default_factory=time.time)


class RolloutEvent(Event, frozen=True, kw_only=True):
    """An event that belongs to one physical execution ``(rollout_id, attempt)``."""

    rollout_id: Token
    attempt: Attempt


class CheckpointEvent(Event, frozen=True, kw_only=True):
    """A checkpoint control marker; its stream sequence is meaningful."""

    checkpoint_id: Token


# --- payload records ---------------------------------------------------------


class TokenReceipt(Struct, frozen=True, kw_only=True, gc=False):
    """Where a token array lives in the token store; never the tokens themselves."""

    receipt_id: Token
    count: Annotated[int, Meta(ge=0)]
    digest: HexDigest
    store: str = ""


class AgentBoundaryRecord(Struct, frozen=True, kw_only=True, gc=False):
    """The state of a whitebox agent after a completed nonterminal turn."""

    record_version: Annotated[int, Meta(ge=1)] = 1
    turn: Annotated[int, Meta(ge=0)]
    output_items: list[Any] = []
    usage: dict[str, int] = {}
    cookies: dict[str, str] = {}
    last_model_call_id: str | None = None
    resources_revisions: dict[str, Revision] = {}
    agent_state: Any = None
