"""Small builders for test events."""

from __future__ import annotations

import asyncio
import inspect
import os
import time
import zlib
from collections.abc import Awaitable, Callable

import msgspec

from rollcut.bus import (
    AgentBoundary,
    AgentBoundaryRecord,
    ModelCallAdmitted,
    ModelCallCompleted,
    ResourcesMutated,
    TokenReceipt,
)
from rollcut.testing import each_rollout_once as each_rollout_once  # the oracle, re-exported


def model_event(
    rollout_id: str, attempt: int = 1, call_id: str | None = None, **kw: object
) -> ModelCallAdmitted:
    return ModelCallAdmitted(
        component="model",
        instance="model-0",
        rollout_id=rollout_id,
        attempt=attempt,
        call_id=call_id or f"c{os.urandom(4).hex()}",
        request_digest="ab" * 8,
        **kw,  # type: ignore[arg-type]
    )


def counter_event(rollout_id: str, revision: int, delta: int, attempt: int = 1) -> ResourcesMutated:
    return ResourcesMutated(
        component="resources",
        instance="res-0",
        rollout_id=rollout_id,
        attempt=attempt,
        session="counter",
        revision=revision,
        tool="add",
        arguments={"n": delta},
        result={"ok": True},
        delta=delta,
    )


def boundary_event(rollout_id: str, turn: int, attempt: int = 1) -> AgentBoundary:
    return AgentBoundary(
        component="agent",
        instance="agent-0",
        rollout_id=rollout_id,
        attempt=attempt,
        record=AgentBoundaryRecord(turn=turn, output_items=[{"turn": turn}], last_model_call_id=f"c{turn}"),
    )


def raw_frame(raw: dict[str, object]) -> bytes:
    """Frame an arbitrary map the way the codec does, bypassing its validation,
    as a foreign or future writer would."""
    body = msgspec.msgpack.encode(raw)
    return b"rc\x01\x00" + zlib.crc32(body).to_bytes(4, "big") + body


def mutation_event(rollout_id: str = "r1", **fields: object) -> ResourcesMutated:
    """A resources mutation with defaults for everything the test does not care about."""
    base: dict[str, object] = dict(
        component="resources",
        instance="x",
        rollout_id=rollout_id,
        attempt=1,
        session="s",
        revision=1,
        tool="t",
    )
    return ResourcesMutated(**{**base, **fields})  # type: ignore[arg-type]


def completed_event(
    rollout_id: str, call_id: str, receipt: TokenReceipt, instance: str = "model-0"
) -> ModelCallCompleted:
    return ModelCallCompleted(
        component="model",
        instance=instance,
        rollout_id=rollout_id,
        attempt=1,
        call_id=call_id,
        request_digest="ab" * 8,
        receipt=receipt,
    )


async def until(
    condition: Callable[[], bool | Awaitable[bool]], *, timeout: float = 15.0, what: str = ""
) -> None:
    """Wait for a condition another process or task makes true; fail, naming it, at the deadline."""
    give_up = time.monotonic() + timeout
    while True:
        met = condition()
        if inspect.isawaitable(met):
            met = await met
        if met:
            return
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        await asyncio.sleep(0.02)
