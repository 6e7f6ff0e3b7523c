"""When a model server takes its running calls' cuts ahead of the next prepare.

Why: a prepare's cut writes each running call's prefix (its token record, then its
``model.prefix_cut``) while the whole namespace stands still: two ordered durable waits, most of
a checkpoint's pause (docs/performance.md). Nothing in a cut needs admission closed: a prefix is
durable whenever its record and event are, and a prepare may report any durable prefix of a call
still generating (the call goes on past it either way; a continuation after a crash resumes from
it). So a server that sees prepares come at a steady period takes the cuts a short lead before
the next is due, with admission open, and that prepare reports them without writing.

What it trades: a crash then loses the tokens generated since the cut taken ahead, the lead plus
however late the prepare came (a cut from before the last prepare, or older than a period, is not
reported: the prepare cuts anew). Prepares at no steady period (a manual
checkpoint, a first few) are never predicted, and cut as before.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections import deque
from collections.abc import Callable

__all__ = ["CutAhead"]


class CutAhead:
    """The prepares a server has seen, the period they keep, and the timer for the next cut ahead."""

    def __init__(
        self, *, fraction: float = 0.1, min_lead_s: float = 0.02, max_lead_s: float = 1.0, seen: int = 5
    ) -> None:
        self.fraction = fraction
        self.min_lead_s = min_lead_s
        self.max_lead_s = max_lead_s
        self._arrivals: deque[float] = deque(maxlen=seen + 1)
        self._timer: asyncio.TimerHandle | None = None

    def period(self) -> float | None:
        """The median gap between the last prepares, if they keep one (no gap over 1.5 times the
        shortest); None: nothing to predict from."""
        seen = list(self._arrivals)
        gaps = sorted(b - a for a, b in itertools.pairwise(seen))
        if len(gaps) < 2 or gaps[0] <= 0 or gaps[-1] > 1.5 * gaps[0]:
            return None
        return gaps[len(gaps) // 2]

    def lead(self, period: float) -> float:
        """How long before a prepare is due the cuts are taken: a tenth of the period, bounded."""
        return min(self.max_lead_s, max(self.min_lead_s, period * self.fraction))

    def fresh_since(self, now: float) -> float:
        """The oldest cut a prepare arriving at ``now`` may report as it stands: taken since the last
        prepare and within a period of this one (``inf`` when no period is known: only a cut with
        nothing generated past it stands, as always). A period, not a few leads: a prepare a little
        later than due would cut again a call just cut ahead, and on a slow engine every cut costs
        an abort and a prefill (measured on Gemma: more tokens generated for nothing)."""
        period = self.period()
        if period is None:
            return math.inf
        return max(self._arrivals[-1], now - period)

    def prepared(self, now: float, take: Callable[[], None]) -> None:
        """A prepare arrived at ``now``: ``take`` is called a lead before the next is due."""
        self._arrivals.append(now)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        period = self.period()
        if period is not None:
            self._timer = asyncio.get_running_loop().call_later(period - self.lead(period), take)
