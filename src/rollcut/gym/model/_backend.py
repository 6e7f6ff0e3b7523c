"""What the model service needs from a generation backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from ._local import Plan

__all__ = ["Backend"]


class Backend(Protocol):
    """What the model service needs from a generation backend."""

    name: str
    can_cut: bool  # can freeze a running generation at a token boundary
    plans_ahead: bool  # knows its output before emitting it (so a prefix can be checked)
    dispositions: tuple[str, ...]
    policy_version: str
    last_policy_version: str | None  # what the upstream said it served last, if it says

    async def start(self, body: dict[str, Any]) -> Plan: ...

    def generate(self, plan: Plan, *, start: int = 0) -> AsyncIterator[int]: ...

    def check_prefix(self, plan: Plan, prefix: list[int]) -> bool: ...
