"""An opaque agent's program as the launcher sees it from outside: its output is read to the end
but kept bounded, and its answer is its last line, decoded strictly. (It dies with its launcher:
``_process.lifeline``.)"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from ..wire import ErrorKind, GymError

__all__ = ["MAX_ANSWER_BYTES", "STDERR_TAIL", "answer_of", "read_capped"]

MAX_ANSWER_BYTES = 1024 * 1024
"""What is read of the agent's stdout."""
STDERR_TAIL = 4000
"""What of its stderr a failure quotes."""


async def read_capped(stream: asyncio.StreamReader, limit: int, *, tail: bool = False) -> bytes:
    """All of a stream read (the agent must not block on a full pipe), at most ``limit`` bytes kept: its
    beginning, or with ``tail`` its end."""
    kept = b""
    while chunk := await stream.read(65536):
        kept = (kept + chunk)[-limit:] if tail else kept + chunk[: max(0, limit - len(kept))]
    return kept


def answer_of(out: bytes) -> dict[str, Any]:
    """The agent's answer: its last non-empty stdout line, a JSON object. The program is untrusted:
    the line is decoded strictly and bounded (no NaN or Infinity, no lone surrogate, no nesting past
    msgspec's limit), ``answer`` is a string and ``turns`` a count, or the run fails (502), never the
    server (a 500)."""
    lines = [ln for ln in out.splitlines() if ln.strip()]
    try:
        answer = msgspec.json.decode(lines[-1]) if lines else None
    except (msgspec.DecodeError, RecursionError):
        answer = None
    if not isinstance(answer, dict):
        raise GymError(ErrorKind.AGENT_FAILED, "the agent printed no answer (a JSON object as its last line)")
    turns = answer.get("turns", 0)
    if not isinstance(answer.get("answer", ""), str) or isinstance(turns, bool) or not isinstance(turns, int):
        raise GymError(ErrorKind.AGENT_FAILED, "the answer needs a string `answer`, an integer `turns`")
    return answer
