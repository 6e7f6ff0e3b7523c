"""Spans and metrics for checkpoint phases, and the percentile every report uses.

Each phase is a span ``rollcut.checkpoint.<phase>`` (exported when tracing is
on, see :mod:`rollcut._tracing`) and feeds
``rollcut_checkpoint_phase_seconds{phase}`` in the process's default registry
(the collector's ``--metrics-port`` serves it); outcomes count in
``rollcut_checkpoint_outcomes_total{outcome}``. The durations are always
returned to the caller too.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import Counter, Histogram

from ._tracing import span

__all__ = ["PhaseTimer", "count_outcome", "ms", "percentile"]

_PHASE = Histogram(
    "rollcut_checkpoint_phase_seconds",
    "Duration of one checkpoint phase",
    ["phase"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
_PARTICIPANT = Histogram(
    "rollcut_participant_reply_seconds",
    "Time for one participant to answer one control op",
    ["op", "instance"],
)
_OUTCOMES = Counter(
    "rollcut_checkpoint_outcomes", "Checkpoints this coordinator took, by outcome", ["outcome"]
)


def ms(seconds: float) -> float:
    """Seconds as milliseconds, to the microsecond: how every phase is reported."""
    return round(seconds * 1000, 3)


class PhaseTimer:
    """Times the phases of one checkpoint; ``ms`` holds the results."""

    def __init__(self, checkpoint_id: str) -> None:
        self.checkpoint_id = checkpoint_id
        self.ms: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str, **attrs: Any) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            with span(
                f"rollcut.checkpoint.{name}",
                attributes={"rollcut.checkpoint_id": self.checkpoint_id, **attrs},
            ):
                yield
        finally:
            dt = time.perf_counter() - t0
            self.ms[name] = round(self.ms.get(name, 0.0) + ms(dt), 3)
            _PHASE.labels(phase=name).observe(dt)

    def participant(self, op: str, instance: str, seconds: float) -> None:
        self.ms[f"{op}:{instance}"] = ms(seconds)
        _PARTICIPANT.labels(op=op, instance=instance).observe(seconds)


def count_outcome(outcome: str) -> None:
    """One checkpoint this process coordinated ended ``outcome`` (published, failed, …)."""
    _OUTCOMES.labels(outcome=outcome).inc()


def percentile(values: list[float], q: int, digits: int = 1) -> float | None:
    """The ``q``-th percentile (inclusive method) of ``values``, rounded; None if there are none.
    One definition for the collector's checkpoint times, the demo and every benchmark."""
    if len(values) < 2:
        return round(values[0], digits) if values else None
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], digits)
