"""The report's "Where the pauses went": each checkpoint's pause by participant, from the stream
(the coordinator's commit marker holds the pause and every prepare's round trip; each
participant's own lane holds its reply, with the time its drain and its export took)."""

from __future__ import annotations

from collections import Counter
from html import escape

from .._telemetry import percentile
from ._timeline import CheckpointMark, Timeline

__all__ = ["pause_section"]

_SHOWN = 12  # the longest pauses, one row each


def _cell(participant: str, mark: CheckpointMark) -> str:
    inside = mark.inside_ms.get(participant, {})
    parts = [f"{k} {inside[k]:.1f}" for k in ("drain", "export") if k in inside]
    detail = f" ({', '.join(parts)})" if parts else ""
    return f"{escape(participant)} {mark.waited_ms[participant]:.1f}{escape(detail)}"


def pause_section(tl: Timeline) -> str:
    timed = [m for m in tl.checkpoints if m.pause_ms is not None and m.waited_ms]
    if not timed:
        return "<p>No checkpoint in the stream says how long it paused (older ones did not).</p>"
    pauses = [m.pause_ms or 0.0 for m in timed]
    slowest = Counter(max(m.waited_ms, key=lambda p: m.waited_ms[p]) for m in timed)
    who = ", ".join(f"{escape(p)} in {n}" for p, n in slowest.most_common(4))
    rows = []
    for m in sorted(timed, key=lambda m: -(m.pause_ms or 0.0))[:_SHOWN]:
        waited = sorted(m.waited_ms, key=lambda p: -m.waited_ms[p])
        rows.append(
            f"<tr><td>{escape(m.checkpoint_id)}</td><td class='n'>{m.pause_ms:.1f}</td>"
            f"<td>{'; '.join(_cell(p, m) for p in waited)}</td></tr>"
        )
    return (
        f"<p>The collection stood still p50 {percentile(pauses, 50)} ms, p99 {percentile(pauses, 99)} ms "
        f"per checkpoint. The prepare waited for longest: {who} (of {len(timed)}).</p>"
        "<table><tr><th>checkpoint</th><th>paused, ms</th><th>each prepare, ms (inside it: drain, "
        "export)</th></tr>" + "".join(rows) + "</table>"
    )
