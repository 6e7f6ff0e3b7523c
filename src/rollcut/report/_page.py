"""``rollcut report``: one self-contained HTML page for a collection home.

One file, no script, no network (a Content-Security-Policy forbids any fetch),
so it can be mailed, attached to an issue or opened from a cluster's shared disk.
"""

from __future__ import annotations

import time
from html import escape
from pathlib import Path
from typing import Any

from .._files import write_private
from .._telemetry import percentile
from ..bus import EventLog
from ..ledger import Ledger
from ._curve import curve_section
from ._pauses import pause_section
from ._svg import MAX_ROWS, timeline_svg
from ._timeline import Timeline, read_timeline

__all__ = ["render_page", "write_report"]

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1f2937;max-width:1180px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.sub{color:#6b7280;margin:0 0 16px}.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{border:1px solid #e5e7eb;border-radius:8px;padding:8px 14px;min-width:110px}
.card b{display:block;font-size:20px}.scroll{overflow:auto;max-height:80vh;border:1px solid #e5e7eb}
table{border-collapse:collapse}td,th{padding:3px 10px;text-align:left;border-bottom:1px solid #f3f4f6}
td.n{text-align:right;font-variant-numeric:tabular-nums}.legend span{margin-right:14px}
.sw{display:inline-block;width:12px;height:10px;border-radius:2px;margin-right:4px;vertical-align:middle}
svg text{font:10px system-ui,sans-serif}.rid{text-anchor:end;fill:#374151}.axis{fill:#6b7280}
.in-bar{fill:#fff;pointer-events:none}.tick{stroke:#f3f4f6}
.attempt.accepted{fill:#16a34a}.attempt.interrupted{fill:#f59e0b}.attempt.retired{fill:#6b7280}
.attempt.running{fill:#60a5fa}.cut{stroke:#2563eb;stroke-dasharray:3 3;stroke-width:1}
.cut.recovery{stroke:#7c3aed;stroke-dasharray:none;stroke-width:2}.cut.many{opacity:.3}.crash{fill:#fecaca;opacity:.7}
.crash-label{fill:#b91c1c;font-weight:600}.cross{stroke:#b91c1c;stroke-width:1.6}
.link{fill:none;stroke:#7c3aed;stroke-width:1.3}.bar{fill:#2563eb}.bar.recovery{fill:#7c3aed}
"""

CHART_W = 1000  # px the checkpoint chart's bars share

_CLASS_MEANING = {
    "first attempt": "finished without being interrupted",
    "continued": "interrupted, then continued from a cut as a later attempt",
    "started over": "interrupted, then run again from the input",
    "retired": "given up for good (its row says retired)",
    "unfinished": "no accepted row yet",
}


def _cards(items: list[tuple[str, Any]]) -> str:
    return (
        '<div class="cards">'
        + "".join(f'<div class="card"><b>{escape(str(v))}</b>{escape(k)}</div>' for k, v in items)
        + "</div>"
    )


def _table(head: list[str], rows: list[list[Any]]) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{v:,}</td>' if isinstance(v, int) else f"<td>{escape(str(v))}</td>" for v in r
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _classes(tl: Timeline) -> str:
    counts = tl.classes()
    most = max(counts.values()) or 1
    rows = []
    for name, n in counts.items():
        width = round(200 * n / most)
        bar = f'<svg width="204" height="12"><rect class="bar" width="{width}" height="10" rx="2"/></svg>'
        rows.append(
            f'<tr><td>{escape(name)}</td><td class="n">{n:,}</td><td>{bar}</td>'
            f"<td>{escape(_CLASS_MEANING[name])}</td></tr>"
        )
    return (
        "<table><thead><tr><th>rollouts that</th><th>count</th><th></th><th>meaning</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _checkpoint_chart(tl: Timeline) -> str:
    done = [m for m in tl.checkpoints if m.ms is not None]
    if not done:
        return "<p>No published checkpoint has both its prepare and its commit in the stream.</p>"
    top = max(m.ms or 0 for m in done) or 1.0
    step = min(18.0, CHART_W / len(done))  # a week's checkpoints still fit the page's width
    w, h = max(round(step * 0.78, 1), 1.0), 120
    bars = []
    for i, m in enumerate(done):
        bh = max(round(h * (m.ms or 0) / top), 1)
        kind = "bar recovery" if m.recovery else "bar"
        title = f"{m.checkpoint_id}: {m.ms:.0f} ms, cut at stream seq {m.cut}"
        bars.append(
            f'<rect class="{kind}" x="{round(40 + i * step, 1)}" y="{h - bh + 10}" width="{w}" height="{bh}">'
            f"<title>{escape(title)}</title></rect>"
        )
    width = round(40 + len(done) * step + 10)
    axis = (
        f'<text class="axis" x="0" y="18">{top:.0f} ms</text><text class="axis" x="0" y="{h + 10}">0</text>'
    )
    ms = [m.ms for m in done if m.ms is not None]
    p50, p99 = percentile(ms, 50), percentile(ms, 99)
    return (
        f'<svg class="checkpoints" width="{width}" height="{h + 20}">{axis}{"".join(bars)}</svg>'
        f"<p>{len(done)} checkpoints, prepare to commit: p50 {p50} ms, p99 {p99} ms, "
        f"largest {top:.0f} ms (purple: sealed by a recovery, or continued from).</p>"
    )


_CSP = "default-src 'none'; style-src 'unsafe-inline'"  # nothing loads, nothing runs: one file, offline

_LEGEND = (
    '<p class="legend"><span><i class="sw" style="background:#16a34a"></i>attempt, row accepted</span>'
    '<span><i class="sw" style="background:#f59e0b"></i>attempt interrupted (✕ where it stopped)</span>'
    '<span><i class="sw" style="background:#b91c1c;opacity:.55"></i>hatched: work a later attempt did '
    'not keep</span><span><i class="sw" style="background:#fecaca"></i>crash</span>'
    "<span>dashed blue: checkpoint cut</span><span>purple: recovery cut, and the arc from what was "
    "continued to its continuation</span></p>"
)


def _work(w: dict[str, int]) -> str:
    return _table(
        ["", "model calls", "tokens", "tool calls"],
        [
            ["generated in all", w.get("generated", 0), w.get("completed_tokens", 0), w.get("mutations", 0)],
            [
                "kept across crashes (not done again)",
                w.get("model_calls_kept", 0),
                w.get("tokens_kept", 0),
                w.get("tool_calls_kept", 0),
            ],
            [
                "done again after a crash",
                w.get("regenerated", 0),
                w.get("tokens_regenerated", 0),
                w.get("tool_calls_reexecuted", 0),
            ],
        ],
    )


def _journal(w: dict[str, int]) -> str:
    """An opaque agent's share: requests its relay answered from the journal, replays that diverged."""
    replayed, diverged = w.get("exchanges_replayed", 0), w.get("divergences", 0)
    if not replayed and not diverged:
        return ""
    return (
        f"<p>Opaque agents: {replayed:,} requests answered from their relay's journal (nothing sent "
        f"upstream); {diverged:,} replays diverged from it (started over, or live for stateless tools).</p>"
    )


def render_page(tl: Timeline, home: str, demo: dict[str, Any] | None = None) -> str:
    """The whole page for ``tl``; ``demo``: the home's ``demo.json``, whose comparison of checkpoint
    intervals (``bench e2e --intervals``) is drawn as curves."""
    drawn = sorted(tl.rollouts, key=lambda r: -len(tl.of(r)))[:MAX_ROWS]
    order = {r: i for i, r in enumerate(tl.rollouts)}
    drawn.sort(key=order.__getitem__)
    accepted = sum(1 for r in tl.rollouts if (t := tl.of(r)) and t[-1].outcome == "accepted")
    unreadable = f", {tl.corrupt} unreadable" if tl.corrupt else ""
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    parts = [
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        f"<title>rollcut report: {escape(home)}</title><style>{_CSS}</style></head><body>",
        f'<h1>rollcut report</h1><p class="sub">{escape(home)} · {when} · '
        f"{tl.events:,} events read from the stream{unreadable}</p>",
        _cards(
            [
                ("rollouts", f"{len(tl.rollouts):,}"),
                ("rows accepted", f"{accepted:,}"),
                ("attempts", f"{len(tl.attempts):,}"),
                ("crashes", len(tl.crashes)),
                ("checkpoints published", len(tl.checkpoints)),
                ("tokens kept across crashes", f"{tl.work.get('tokens_kept', 0):,}"),
            ]
        ),
        "<h2>Timeline</h2><p>A row per rollout, a bar per attempt (hover a bar: its rollout, attempt and "
        "what it did). Time runs left to right from the first event.</p>",
        _LEGEND,
    ]
    if len(drawn) < len(tl.rollouts):
        parts.append(
            f"<p>Showing {len(drawn):,} of {len(tl.rollouts):,} rollouts: those with most attempts.</p>"
        )
    parts += [
        f'<div class="scroll">{timeline_svg(tl, drawn)}</div>',
        "<h2>How each rollout ended up</h2>",
        _classes(tl),
        "<h2>Checkpoints</h2>",
        _checkpoint_chart(tl),
        "<h3>Where the pauses went</h3>",
        pause_section(tl),
        "<h2>Work kept and done again</h2>",
        _work(tl.work),
        _journal(tl.work),
        curve_section(demo),
        '<p class="sub">Counted from the stream: a model call is done again when a later attempt generated '
        "the same request; kept when an attempt continued from a cut after it. Times are the writers' "
        "clocks.</p></body></html>\n",
    ]
    return "".join(parts)


async def write_report(
    log: EventLog, ledger: Ledger, out: Path, home: str, demo: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Read the collection, write its page to ``out`` (0600), and return what it shows in numbers."""
    tl = await read_timeline(log, ledger)
    write_private(out, render_page(tl, home, demo).encode())
    return {
        "report": str(out),
        "rollouts": len(tl.rollouts),
        "attempts": len(tl.attempts),
        "crashes": len(tl.crashes),
        "checkpoints": len(tl.checkpoints),
        "events": tl.events,
        "classes": tl.classes(),
        "work": tl.work,
    }
