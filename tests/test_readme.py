"""The README names only what a clone of the repository has."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_path_the_readme_names_is_in_the_repository() -> None:
    text = (ROOT / "README.md").read_text()
    named = set(
        re.findall(r"`((?:\.\./|\./)?(?:docs|examples|deploy|benchmarks|src|tests|\.ci)/[^`\s]*)`", text)
    )
    assert named, "the README names the docs it points at"
    outside = sorted(p for p in named if p.startswith("../"))
    assert not outside, f"the README points outside the repository: {outside}"
    missing = sorted(p for p in named if not (ROOT / p.rstrip("/")).exists())
    assert not missing, f"the README names what the repository does not have: {missing}"
    assert "../" not in text, "a path out of the repository"
