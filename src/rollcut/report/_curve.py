"""The cost of a crash against the checkpoint interval: one curve per way of recovering.

``rollcut bench e2e --intervals 0.5,2,8,32 --home H`` (or the demo's ``demo.json``) recovers copies
of one crash with the "last checkpoint only" way at each interval; rollcut and restart-from-input do
not depend on it. The chart puts the interval on a log axis and the work done again (model calls
generated again) up: rollcut flat at zero because its cut is the stream's sealed tail, the last
checkpoint rising with the interval, restart flat at everything that was running.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

__all__ = ["curve_section"]

_W, _H, _PAD = 640, 260, 48
_WAYS = {
    "rollcut": ("rollcut", "#16a34a"),
    "last_checkpoint": ("last checkpoint only", "#f59e0b"),
    "restart": ("restart from input", "#dc2626"),
}
_METRIC = "model_calls_regenerated"


def _points(demo: dict[str, Any]) -> dict[str, list[tuple[float, float]]] | None:
    by_interval = demo.get("by_interval")
    compared = demo.get("compared") or {}
    if not isinstance(by_interval, dict) or not by_interval:
        return None
    try:
        xs = sorted(float(k) for k in by_interval)
        last = [(x, float(by_interval[_key(by_interval, x)][_METRIC])) for x in xs]
        out = {"last_checkpoint": last}
        for way in ("rollcut", "restart"):
            if isinstance(compared.get(way), dict):
                y = float(compared[way][_METRIC])
                out[way] = [(x, y) for x in xs]
    except (KeyError, TypeError, ValueError):
        return None  # not the shape bench e2e writes: no chart rather than a wrong one
    if not all(x > 0 and math.isfinite(x) and math.isfinite(y) for pts in out.values() for x, y in pts):
        return None
    return out


def _key(by_interval: dict[str, Any], x: float) -> str:
    return next(k for k in by_interval if float(k) == x)


def curve_section(demo: dict[str, Any] | None) -> str:
    """The section's HTML, or "" when the home holds no interval comparison."""
    pts = _points(demo) if isinstance(demo, dict) else None
    if not pts:
        return ""
    xs = [x for x, _ in pts["last_checkpoint"]]
    top = max((y for p in pts.values() for _, y in p), default=0.0) or 1.0
    lo, hi = math.log2(min(xs)), math.log2(max(xs))
    span = (hi - lo) or 1.0

    def px(x: float) -> float:
        return _PAD + (math.log2(x) - lo) / span * (_W - 2 * _PAD)

    def py(y: float) -> float:
        return _H - _PAD - y / top * (_H - 2 * _PAD)

    parts = [f'<svg class="curve-chart" width="{_W}" height="{_H}" role="img">']
    parts.append(f'<line class="tick" x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}"/>')
    for x in xs:
        parts.append(f'<text class="axis" x="{px(x):.1f}" y="{_H - _PAD + 14}">{x:g} s</text>')
    parts.append(f'<text class="axis" x="4" y="{py(top):.1f}">{top:g}</text>')
    parts.append(f'<text class="axis" x="4" y="{py(0):.1f}">0</text>')
    for way, line in pts.items():
        name, colour = _WAYS[way]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in line)
        parts.append(
            f'<polyline class="curve" data-way="{way}" fill="none" stroke="{colour}" stroke-width="2" '
            f'points="{coords}"><title>{escape(name)}</title></polyline>'
        )
    parts.append("</svg>")
    legend = "".join(
        f'<span><i class="sw" style="background:{_WAYS[w][1]}"></i>{escape(_WAYS[w][0])}</span>' for w in pts
    )
    rows = "".join(
        f'<tr><td class="n">{x:g} s</td>'
        + "".join(f'<td class="n">{dict(pts[w])[x]:g}</td>' for w in pts)
        + "</tr>"
        for x in xs
    )
    head = "".join(f"<th>{escape(_WAYS[w][0])}</th>" for w in pts)
    return (
        "<h2>Work done again against the checkpoint interval</h2>"
        "<p>The same crash recovered on copies: model calls generated again when the last checkpoint "
        "was taken every so many seconds (log scale). rollcut's cut is the stream's sealed tail, "
        "whatever the interval.</p>"
        f'<p class="legend">{legend}</p>{"".join(parts)}'
        f"<table><tr><th>interval</th>{head}</tr>{rows}</table>"
    )
