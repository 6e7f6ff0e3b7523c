"""How a benchmark reports a figure it measured several times: its median and its range."""

from __future__ import annotations

import statistics

__all__ = ["spread"]


def spread(values: list[float], digits: int = 3) -> dict[str, float]:
    """``median``, ``min`` and ``max`` of repeated measurements (a ratio is taken per repeat, against
    its baseline in the same repeat, before it is spread: the machine's drift falls on both)."""
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }
