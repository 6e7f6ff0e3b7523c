"""What the demo's model generated, by its own count: the engine's (llama.cpp's counter, when rollcut
started it) or the local model's (a file a SIGKILL keeps, ``gym._pace``), per way of recovering, against
what completed calls used; and the local model's options that make it count and pace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..gym._pace import GEMMA_ON_TWO_CORES, TokenTally
from ._phase import Phase

__all__ = ["Counter", "local_options"]


def local_options(count: Path, paced: bool) -> dict[str, str]:
    """The local model's options in the demo: its token count, and its pace (see :func:`run_demo`)."""
    out = {"count_tokens": str(count)}
    if paced:
        p = GEMMA_ON_TWO_CORES
        out |= {
            "token_delay": "0",
            "step_ms": f"{p.step_s * 1000:g}",
            "per_sequence_ms": f"{p.per_sequence_s * 1000:g}",
        }
    return out


class Counter:
    """The generator's own token counter (the engine's, or the local model's file): what one way of
    recovering made it generate is what it generated before the crash plus what it generated during
    that way's own recovery."""

    def __init__(self, engine: Any, dialect: str | None, cuts: bool, count: Path | None = None) -> None:
        self.engine, self.dialect, self.cuts, self.count = engine, dialect, cuts, count

    @classmethod
    def local(cls, count: Path) -> Counter:
        return cls(None, "local", True, count)

    def read(self) -> int | None:
        if self.count is not None:
            return TokenTally.read(self.count)
        return self.engine.tokens_predicted() if self.engine is not None else None

    def plus(self, pre: int | None, start: int | None) -> int | None:
        """``pre`` and what was generated since the counter read ``start``."""
        now = self.read()
        return None if now is None or pre is None or start is None else pre + now - start

    def work(self, done: Phase, total: int | None, pre: int | None) -> dict[str, Any] | None:
        """The generator's figures for a run that ended in ``done`` (None: an engine's, not rollcut's);
        ``pre``: what it had generated at the crash."""
        if self.dialect is None:
            return None
        return _engine_work(self.dialect, self.cuts, total, pre, done.counts)


def _engine_work(
    dialect: str, cuts: bool, total: int | None, pre: int | None, counts: dict[str, int]
) -> dict[str, Any]:
    """What the model generated (its own counter: the engine's when rollcut started it, or the
    local model's) against the outputs of completed calls, each of whose tokens was generated once
    (a continued call's prefix before the crash, its rest after): the rest was generated for
    nothing (tails of calls in flight at the crash past their last cut, or whole calls without
    cuts; tokens past a cut's boundary before the abort)."""
    needed = counts["completed_tokens"]
    return {
        "dialect": dialect,
        "cuts": cuts,
        "tokens_generated": total,
        "tokens_for_completed_calls": needed,
        "tokens_kept_by_cuts": counts["continued_tokens"],
        "tokens_wasted": None if total is None else total - needed,
        # what this way's recovery made it generate: what its seconds to finish were spent on
        "tokens_generated_after_crash": None if total is None or pre is None else total - pre,
    }
