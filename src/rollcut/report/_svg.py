"""The timeline as inline SVG: a row per rollout, a bar per attempt, the cuts and the crashes.

No script: every bar names its rollout and attempt in a ``<title>`` (the
browser's own hover) and in ``data-`` attributes; what a crash lost is the
hatched part of a bar, what a continuation took over is the arc to the next.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from html import escape

from ._timeline import Attempt, Timeline

__all__ = ["MAX_ROWS", "timeline_svg"]

MAX_ROWS = 1500
"""Rollouts drawn at most (those with more than one attempt first): a page stays a page."""

ROW, BAR, LABEL_W, PLOT_W, TOP = 14, 10, 92, 1000, 30
MANY_CUTS = 40  # more checkpoint lines than this are drawn faint


def _step(span: float) -> float:
    """A round tick interval giving five to ten ticks over ``span`` seconds."""
    raw = span / 8
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def timeline_svg(tl: Timeline, rows: list[str]) -> str:
    """The SVG of ``rows`` (rollout ids) on ``tl``'s time axis."""
    span = max(tl.t1 - tl.t0, 1e-3)

    def x(t: float) -> float:
        return round(LABEL_W + (t - tl.t0) / span * PLOT_W, 1)

    height = TOP + len(rows) * ROW + 8
    bottom = height - 4
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{LABEL_W + PLOT_W + 20}" '
        f'height="{height}" role="img" aria-label="timeline of {len(rows)} rollouts">',
        '<defs><pattern id="lost" width="5" height="5" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="2.5" height="5" fill="#b91c1c" opacity="0.55"/>'
        "</pattern></defs>",
    ]
    step = _step(span)
    for k in range(int(span / step) + 1):
        tx = x(tl.t0 + k * step)
        out.append(f'<line class="tick" x1="{tx}" y1="{TOP - 6}" x2="{tx}" y2="{bottom}"/>')
        out.append(f'<text class="axis" x="{tx}" y="{TOP - 10}">{k * step:g} s</text>')
    for c in tl.crashes:
        x1, x2 = x(c.last_alive), x(c.recovered)
        title = (
            f"crash: {c.interrupted} attempts interrupted; last sign of life {c.last_alive - tl.t0:.2f} s, "
            f"recovered {c.recovered - tl.t0:.2f} s" + (f" from {c.checkpoint_id}" if c.checkpoint_id else "")
        )
        band = f'x="{x1}" y="{TOP - 6}" width="{max(x2 - x1, 3)}" height="{bottom - TOP + 6}"'
        out.append(f'<rect class="crash" {band}><title>{escape(title)}</title></rect>')
        out.append(f'<text class="crash-label" x="{x1 + 3}" y="{TOP + 2}">crash</text>')
    many = " many" if len(tl.checkpoints) > MANY_CUTS else ""  # faint, so the bars stay readable
    for m in tl.checkpoints:
        if m.sealed is None or not tl.t0 <= m.sealed <= tl.t1:
            continue
        kind = "cut recovery" if m.recovery else f"cut{many}"
        took = f", {m.ms:.0f} ms end to end" if m.ms is not None else ""
        title = f"checkpoint {m.checkpoint_id}: cut at stream seq {m.cut}{took}"
        cx = x(m.sealed)
        out.append(
            f'<line class="{kind}" x1="{cx}" y1="{TOP - 6}" x2="{cx}" y2="{bottom}">'
            f"<title>{escape(title)}</title></line>"
        )
    for i, rid in enumerate(rows):
        y = TOP + i * ROW
        out.append(f'<text class="rid" x="{LABEL_W - 6}" y="{y + BAR - 1}">{escape(rid)}</text>')
        tries = tl.of(rid)
        for n, a in enumerate(tries):
            out += _bar(tl, a, tries[n + 1] if n + 1 < len(tries) else None, y, x)
    out.append("</svg>")
    return "\n".join(out)


def _bar(tl: Timeline, a: Attempt, after: Attempt | None, y: int, x: Callable[[float], float]) -> list[str]:
    """One attempt's bar, the part of it a later attempt did not keep, and the arc to that attempt."""
    start = a.start if a.start is not None else a.opened
    end = a.end if a.end is not None else start
    x1, x2 = x(start), x(end)
    w = max(x2 - x1, 2)
    rid = escape(a.rollout_id)
    title = escape(_describe(a))
    out = [
        f'<rect class="attempt {a.outcome}" data-rollout="{rid}" data-attempt="{a.attempt}" '
        f'x="{x1}" y="{y}" width="{w}" height="{BAR}" rx="2"><title>{title}</title></rect>'
    ]
    if w > 22:
        out.append(f'<text class="in-bar" x="{x1 + 3}" y="{y + BAR - 2}">a{a.attempt}</text>')
    if a.outcome == "interrupted":
        out.append(f'<path class="cross" d="M{x2 - 3},{y} l6,{BAR} M{x2 + 3},{y} l-6,{BAR}"/>')
    if after is None:
        return out
    cut_at = tl.cut_time(after.from_cut) if after.from_cut > 0 else None
    lost_from = start if after.from_cut == 0 else (cut_at if cut_at is not None and cut_at < end else None)
    if lost_from is not None and end > lost_from:
        lx = x(lost_from)
        lost = (
            f"lost: attempt {after.attempt} started over from the input"
            if after.from_cut == 0
            else f"lost: done after the cut attempt {after.attempt} continued from (seq {after.from_cut})"
        )
        out.append(
            f'<rect class="lost" x="{lx}" y="{y}" width="{max(x2 - lx, 1)}" height="{BAR}" fill="url(#lost)">'
            f"<title>{escape(lost)}</title></rect>"
        )
    if after.from_cut > 0:
        ax = x(min(end, cut_at) if cut_at is not None else end)
        bx = x(after.start if after.start is not None else after.opened)
        mid = round((ax + bx) / 2, 1)
        what = f"attempt {after.attempt} continued attempt {a.attempt} from the cut at stream seq "
        what += str(after.from_cut)
        arc = f"M{ax},{y + 1} Q{mid},{y - 7} {bx},{y + 1}"
        out.append(f'<path class="link" d="{arc}"><title>{escape(what)}</title></path>')
    return out


def _describe(a: Attempt) -> str:
    """A bar's hover title: which rollout and attempt, how it ended, what it did, where it came from."""
    parts = [f"rollout {a.rollout_id}, attempt {a.attempt}: {a.outcome}"]
    if a.reward is not None:
        parts.append(f"reward {a.reward:g}")
    parts.append(f"{a.model_calls} model calls generated ({a.tokens} tokens), {a.tool_calls} tool calls")
    if a.from_log:
        parts.append(f"{a.from_log} model calls served from the log")
    if a.attempt > 1:
        parts.append(
            f"continued from the cut at stream seq {a.from_cut} ({a.checkpoint_id})"
            if a.from_cut > 0
            else f"started over from the input ({a.reason or 'fresh dispatch'})"
        )
    if a.start is not None and a.end is not None:
        parts.append(f"ran {a.end - a.start:.2f} s")
    return "; ".join(parts)
