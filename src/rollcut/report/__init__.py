"""``rollcut report``: a collection home as one self-contained HTML page (timeline, recovery classes,
checkpoint durations, work kept across crashes)."""

from ._page import render_page, write_report
from ._svg import MAX_ROWS
from ._timeline import CRASH_GAP_S, Attempt, CheckpointMark, Crash, Timeline, read_timeline

__all__ = [
    "CRASH_GAP_S",
    "MAX_ROWS",
    "Attempt",
    "CheckpointMark",
    "Crash",
    "Timeline",
    "read_timeline",
    "render_page",
    "write_report",
]
