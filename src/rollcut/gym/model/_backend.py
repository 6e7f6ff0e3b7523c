"""What the model service needs from a generation backend, and the plan every backend trades in."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ...tokens import TokenRecord

__all__ = ["Backend", "OnToken", "Plan"]


OnToken = Callable[[int, str, float], Awaitable[None]]
"""Called with each token id of a call, its text and its log-prob as it is generated (a stream's
deltas, and their log-probs when a streamed request asks for them)."""


@dataclass
class Plan:
    """What a call will produce, fixed before the first token."""

    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    stop_sequence: str | None = None  # the stop string that ended it, when the backend says which
    handle: Any = None  # the backend's own state of a running call (an engine's open request)
    # set by the model service before it generates, for a backend that knows which request made which
    # token: the policy version in force now, and the hook to call with (first output index, version)
    # when a request's answer begins (see ``Segments.opened``)
    clock: Callable[[], int] | None = None
    opened: Callable[[int, int], None] | None = None

    def logprob(self, index: int) -> float:
        """The log-prob of the ``index``-th output token (every backend puts it there before the
        token is handed on; 0.0 for one it has not)."""
        return self.logprobs[index] if index < len(self.logprobs) else 0.0


class Backend(Protocol):
    """What the model service needs from a generation backend."""

    name: str
    can_cut: bool  # can freeze a running generation at a token boundary
    plans_ahead: bool  # start() generates nothing (it runs before admission; a prefix can be checked)
    dispositions: tuple[str, ...]
    policy_version: str
    last_policy_version: str | None  # what the upstream said it served last, if it says

    async def start(self, body: dict[str, Any]) -> Plan: ...

    def generate(self, plan: Plan, *, start: int = 0) -> AsyncGenerator[int, None]: ...

    async def adopt_prefix(self, plan: Plan, record: TokenRecord) -> bool:
        """Take a durable prefix as the start of this call's output, if it belongs to it."""
        ...

    def streams_text(self, body: dict[str, Any]) -> bool:
        """Whether a streamed reply sends its text token by token (not when it may be a tool call)."""
        ...

    def piece(self, plan: Plan, index: int) -> str:
        """The text of the plan's ``index``-th output token, as a stream delta."""
        ...

    def interrupt(self, plan: Plan) -> None:
        """A cut took the call's buffer as its prefix: whatever generates past it stops, and the call
        goes on from the prefix. Synchronous: nothing runs between the swap and this."""
        ...
