"""A collection's signals: SIGUSR1 takes a checkpoint, SIGTERM takes one and stops (exit 75).

A signal is never ignored and never leaves a stray traceback: a checkpoint that cannot be
taken (a full or lost bus, a deadline passed) is recorded in the summary in one line, and
SIGTERM stops the collection whatever happened (a stalled bus or a full disk must not keep a
job alive past its scheduler's grace period). Without a checkpoint the exit is not 75: what
the collection failed on decides it (74 for the bus or the disk).
"""

from __future__ import annotations

import asyncio
import signal
from typing import TYPE_CHECKING

from .._errors import RollcutError

if TYPE_CHECKING:
    from ._collector import Collector

__all__ = ["install_signals"]


def install_signals(col: Collector, *, on_sigusr1: bool = True, on_sigterm: bool = True) -> None:
    loop = asyncio.get_running_loop()
    if on_sigusr1:
        loop.add_signal_handler(signal.SIGUSR1, lambda: asyncio.ensure_future(_checkpoint(col)))
    if on_sigterm:
        loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(_term(col)))


async def _checkpoint(col: Collector) -> None:
    try:
        await col.checkpoint()
    except RollcutError as exc:
        col.summary.failed.setdefault("checkpoint", f"SIGUSR1: no checkpoint: {exc}"[:300])


async def _term(col: Collector) -> None:
    try:
        ck = await asyncio.wait_for(col.checkpoint(), col.deadline_s + col.coordinator.grace_s)
    except TimeoutError:
        col.summary.failed.setdefault("checkpoint", "SIGTERM: the checkpoint did not finish in time")
        ck = None
    except RollcutError as exc:  # a full or lost bus: no checkpoint, said in one line
        col.summary.failed.setdefault("checkpoint", f"SIGTERM: no checkpoint: {exc}"[:300])
        ck = None
    col.summary.requeue_checkpoint = ck
    col.stop()
