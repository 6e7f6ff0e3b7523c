"""Small modules with one job each: no module of the package is over 450 lines."""

from __future__ import annotations

from pathlib import Path

import rollcut

LIMIT = 450


def test_no_module_is_over_450_lines() -> None:
    root = Path(rollcut.__file__).parent
    modules = sorted(root.rglob("*.py"))
    assert len(modules) > 100, "the package's modules were found"
    over = {str(p.relative_to(root)): n for p in modules if (n := len(p.read_text().splitlines())) > LIMIT}
    assert not over, f"modules over {LIMIT} lines (split them by responsibility): {over}"
