"""Spans and metrics for checkpoint phases; both optional at run time.

With ``opentelemetry-api`` installed each phase is a span (attributes:
checkpoint id, participant, counts); with ``prometheus-client`` installed
each phase feeds ``rollcut_checkpoint_phase_seconds{phase}`` and outcomes
``rollcut_checkpoints_total{outcome}``. Without them this module costs a
dict write per phase: the durations are always returned to the caller.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["PhaseTimer", "count_outcome", "ms", "percentile"]

try:  # pragma: no cover - exercised only where the package is installed
    from opentelemetry import trace as _trace

    _tracer: Any = _trace.get_tracer("rollcut")
except ImportError:  # pragma: no cover
    _tracer = None

try:  # pragma: no cover
    from prometheus_client import Counter, Histogram

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
    _OUTCOMES = Counter("rollcut_checkpoints_total", "Checkpoints by outcome", ["outcome"])
except ImportError:  # pragma: no cover
    _PHASE = _PARTICIPANT = _OUTCOMES = None  # type: ignore[assignment]


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
        span_cm = (
            _tracer.start_as_current_span(
                f"rollcut.checkpoint.{name}",
                attributes={"rollcut.checkpoint_id": self.checkpoint_id, **attrs},
            )
            if _tracer is not None
            else None
        )
        if span_cm is not None:
            span_cm.__enter__()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self.ms[name] = round(self.ms.get(name, 0.0) + ms(dt), 3)
            if _PHASE is not None:
                _PHASE.labels(phase=name).observe(dt)
            if span_cm is not None:
                span_cm.__exit__(None, None, None)

    def participant(self, op: str, instance: str, seconds: float) -> None:
        self.ms[f"{op}:{instance}"] = ms(seconds)
        if _PARTICIPANT is not None:
            _PARTICIPANT.labels(op=op, instance=instance).observe(seconds)


def count_outcome(outcome: str) -> None:
    if _OUTCOMES is not None:
        _OUTCOMES.labels(outcome=outcome).inc()


def percentile(values: list[float], q: int, digits: int = 1) -> float | None:
    """The ``q``-th percentile (inclusive method) of ``values``, rounded; None if there are none.
    One definition for the collector's checkpoint times, the demo and every benchmark."""
    if len(values) < 2:
        return round(values[0], digits) if values else None
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], digits)
