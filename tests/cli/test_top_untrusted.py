"""``rollcut top`` prints what others wrote as text (issue 49): a rollout's error is a sandboxed
program's stderr, and before it ``[/red]`` ended top with rich's MarkupError (exit 70) and an OSC
escape retitled the operator's terminal."""

from __future__ import annotations

import io

from rich.console import Console

from rollcut.cli._top import _view

HOSTILE = "boom [/red] [bold]x[/bold] \x1b]0;owned\x07 \x1b[2J done"


def _sample() -> dict[str, object]:
    return {
        "namespace": "ns",
        "collector": "http://127.0.0.1:1",
        "rollouts": {"running": 1},
        "checkpoints": {
            "published": 1,
            "per_minute": 1.0,
            "failed": 0,
            "last": "ck-1",
            "last_pause_ms": 2.0,
            "participants": 3,
        },
        "recovery": {"continued": 0},
        "bus": {"up": False, "outage": HOSTILE},
        "servers": [{"url": "http://127.0.0.1:2", "healthy": False, "error": HOSTILE, "workers": []}],
        "errors": {"total": 1, "recent": {"r[/red]1": HOSTILE}},
    }


def test_untrusted_text_is_shown_as_text_with_control_characters_escaped() -> None:
    out = io.StringIO()
    Console(file=out, width=400, force_terminal=True, color_system="truecolor").print(_view(_sample()))
    shown = out.getvalue()
    assert shown.count("[/red]") == 4 and "[bold]x[/bold]" in shown  # as written, not as markup
    assert "\x1b]0;owned" not in shown and "\x1b[2J" not in shown  # no escape reaches the terminal
    assert "\\x1b]0;owned\\x07" in shown  # but the operator sees what was there
