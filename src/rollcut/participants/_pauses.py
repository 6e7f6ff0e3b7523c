"""Where a checkpoint's pause goes: its phases as the coordinator timed them, and each component's
prepare as the coordinator waited for it (the round trip, and inside the participant its drain
and its export), over a run's checkpoints (``bench e2e``, ``rollcut demo --json``)."""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from typing import Any

from .._telemetry import percentile
from ._result import CheckpointResult

__all__ = ["PAUSE_PHASES", "PauseBreakdown"]

PAUSE_PHASES = ("prepare", "seal", "release")
"""The coordinator's phases that make up the pause, in order (everyone prepares at once; the seal
fixes the cut; the release reopens the servers, then the agents that call them)."""

_KEEP = 10_000  # checkpoints a breakdown remembers: a week-long run's last ones, not all of them


class PauseBreakdown:
    """Accumulates checkpoints' results; :meth:`summary` is the breakdown (p50 and p99 of each)."""

    def __init__(self) -> None:
        self._phases: deque[dict[str, float]] = deque(maxlen=_KEEP)
        self._waited: deque[dict[str, dict[str, float]]] = deque(maxlen=_KEEP)
        self._slowest: Counter[str] = Counter()

    def add(self, res: CheckpointResult) -> None:
        self._phases.append({p: res.phases_ms.get(p, 0.0) for p in PAUSE_PHASES})
        by_component: dict[str, dict[str, float]] = {}
        for instance, ms in res.waited_ms.items():
            component = res.components.get(instance, instance)
            got = {**ms, "wire_and_queue": max(0.0, ms.get("round_trip", 0.0) - ms.get("total", 0.0))}
            mine = by_component.setdefault(component, {})
            for k, v in got.items():  # the slowest instance of a component is what the pause waited for
                mine[k] = max(mine.get(k, 0.0), v)
        self._waited.append(by_component)
        if by_component:
            self._slowest[max(by_component, key=lambda c: by_component[c].get("round_trip", 0.0))] += 1

    def summary(self) -> dict[str, Any]:
        def pct(values: list[float]) -> dict[str, float | None]:
            return {"p50": percentile(values, 50, 2), "p99": percentile(values, 99, 2)}

        waited: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for ck in self._waited:
            for component, ms in ck.items():
                for k, v in ms.items():
                    waited[component][k].append(v)
        return {
            "checkpoints": len(self._phases),
            "phases_ms": {p: pct([ck[p] for ck in self._phases]) for p in PAUSE_PHASES},
            "waited_ms": {c: {k: pct(v) for k, v in sorted(ks.items())} for c, ks in sorted(waited.items())},
            "slowest": dict(self._slowest.most_common()),
        }
