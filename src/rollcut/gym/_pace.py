"""How fast the local backend generates, and a count of what it generated that a SIGKILL keeps.

Why a shared clock and not a delay per token: a real engine on a CPU decodes every running
sequence in one batched step whose time grows with the batch, so its throughput is shared. A delay
per call gives each call its own clock, and then the seconds of a recovery follow its longest
rollout, not the tokens it generates: the demo showed rollcut keeping thousands of tokens and
finishing no sooner. :class:`Pace` is one decode loop per server process: a step takes
``step_s + per_sequence_s * batch`` and gives one token to every sequence waiting at its start.

:class:`TokenTally` counts generated tokens in a file, one byte each, appended: its length is the
count, written as the tokens are, so what a killed server generated for calls it never finished
(the tokens a crash loses in flight) is still counted. Several worker processes share one file:
``O_APPEND`` writes do not interleave.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GEMMA_ON_TWO_CORES", "Pace", "PaceProfile", "TokenTally"]


@dataclass(frozen=True)
class PaceProfile:
    """A decode step's cost: fixed, and per sequence in the batch (seconds)."""

    step_s: float
    per_sequence_s: float
    what: str

    def tokens_per_s(self, batch: int) -> float:
        """The throughput this profile gives ``batch`` sequences decoding together."""
        return batch / (self.step_s + self.per_sequence_s * batch)


GEMMA_ON_TWO_CORES = PaceProfile(
    0.0113,
    0.00492,
    "Gemma 3 270M (Q4_K_M) under llama.cpp's server on this machine's two cores: 65 tokens/s for one "
    "sequence, 154 for 8 together, 190 for 32 (docs/demo-and-report.md)",
)
"""The demo's pace: a least-squares fit of step time to batch size over those three measurements."""


class Pace:
    """One batched decode loop: :meth:`token` returns when the step this sequence joined ends."""

    def __init__(self, step_s: float, per_sequence_s: float) -> None:
        self.step_s, self.per_sequence_s = step_s, per_sequence_s
        self.steps = 0
        self._waiting: list[asyncio.Future[None]] = []
        self._loop: asyncio.Task[None] | None = None

    async def token(self) -> None:
        """Wait for one token: the next step's, shared with every sequence waiting for it."""
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        if self._loop is None or self._loop.done():
            self._loop = asyncio.create_task(self._steps())
        await fut

    async def _steps(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            await asyncio.sleep(self.step_s + self.per_sequence_s * len(batch))
            self.steps += 1
            for fut in batch:
                if not fut.done():  # a sequence cancelled mid-step still cost the step its share
                    fut.set_result(None)


class TokenTally:
    """Generated tokens counted as a file's length (one byte appended per token)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def add(self, n: int = 1) -> None:
        os.write(self._fd, b"\0" * n)

    def close(self) -> None:
        os.close(self._fd)

    @staticmethod
    def read(path: Path) -> int:
        """Tokens counted so far (0 before the first)."""
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return 0
