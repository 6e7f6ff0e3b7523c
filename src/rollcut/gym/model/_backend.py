"""What the model service needs from a generation backend."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Protocol

from ._local import Plan

if TYPE_CHECKING:
    from ...tokens import TokenRecord

__all__ = ["Backend"]


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
