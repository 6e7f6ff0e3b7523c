"""What the demo's model generated, by its own count: the engine's (llama.cpp's counter, when rollcut
started it) or the local model's (a file a SIGKILL keeps, ``gym._pace``), per way of recovering, against
what completed calls used; and the local model's options that make it count and pace."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..gym._pace import GEMMA_ON_TWO_CORES, TokenTally
from ._phase import Phase

__all__ = ["Counter", "Generated", "local_options"]


def local_options(count: Path | None, paced: bool) -> dict[str, str]:
    """The local model's options in the demo: its token count (``count``; None: nothing to cost,
    no crash), and its pace (see :func:`run_demo`)."""
    out = {"count_tokens": str(count)} if count is not None else {}
    if paced:
        p = GEMMA_ON_TWO_CORES
        out |= {
            "token_delay": "0",
            "step_ms": f"{p.step_s * 1000:g}",
            "per_sequence_ms": f"{p.per_sequence_s * 1000:g}",
        }
    return out


@dataclass(frozen=True)
class Generated:
    """One way's figures from the model's own counter: the engine's JSON (``figures``; None: nothing
    counted) and what the way's recovery generated (``after_crash``; None: not counted)."""

    figures: dict[str, Any] | None = None
    after_crash: int | None = None


class Counter:
    """The model's own token counter. What one way of recovering made it generate is what it generated
    before the crash (:attr:`pre`, read once, shared by every way) plus what it generated since that
    way's recovery began."""

    def __init__(self, read: Callable[[], int | None] | None, dialect: str, cuts: bool) -> None:
        self._read, self.dialect, self.cuts = read, dialect, cuts
        self.pre: int | None = None

    @classmethod
    def of(cls, engine: Any, dialect: str | None, cuts: bool, count: Path | None) -> Counter:
        """An engine's (``dialect``: its counter when rollcut started it, ``engine``), else the local
        model's file (``count``; None: nothing counted)."""
        if dialect is not None:
            return cls(engine.tokens_predicted if engine is not None else lambda: None, dialect, cuts)
        return cls((lambda: TokenTally.read(count)) if count is not None else None, "local", True)

    def read(self) -> int | None:
        return self._read() if self._read is not None else None

    def work(self, done: Phase, start: int | None) -> Generated:
        """The figures of a run that ended in ``done``, whose recovery began when the counter read
        ``start`` (None: there was no crash, the run is the one before it)."""
        if self._read is None:
            return Generated()
        now, pre = self._read(), self.pre
        since = None if now is None or start is None else now - start
        total = pre if start is None else None if since is None or pre is None else pre + since
        needed = done.counts["completed_tokens"]
        # each token of a completed call's output was generated once (a continued call's prefix before
        # the crash, its rest after): the rest was generated for nothing (tails of calls in flight at
        # the crash past their last cut, or whole calls without cuts; tokens past a cut's boundary
        # before the abort)
        figures = {
            "dialect": self.dialect,
            "cuts": self.cuts,
            "tokens_generated": total,
            "tokens_for_completed_calls": needed,
            "tokens_kept_by_cuts": done.counts["continued_tokens"],
            "tokens_wasted": None if total is None else total - needed,
        }
        return Generated(figures, since)
