"""The drawn exception tree (``rollcut._errors``'s docstring) is the tree: every subclass of
``RollcutError`` anywhere in the package is drawn, under the parent it has."""

from __future__ import annotations

import importlib
import pkgutil
import re

import rollcut
from rollcut import RollcutError, _errors


def _every_subclass(root: type) -> set[type]:
    out: set[type] = set()
    todo = [root]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


def _drawn() -> dict[str, str]:
    """Each drawn name -> the name drawn as its parent (by indentation), from the root's line to
    the blank line that ends the drawing."""
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    lines = (_errors.__doc__ or "").splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "RollcutError")
    for line in lines[start:]:
        if not line.strip():
            break
        m = re.match(r"^[\s│├└─]*([A-Z]\w+)", line)
        assert m, line
        depth = len(line) - len(line.lstrip(" │├└─"))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            parents[m.group(1)] = stack[-1][1]
        stack.append((depth, m.group(1)))
    return parents


def test_every_rollcut_error_is_drawn_under_its_parent() -> None:
    for mod in pkgutil.walk_packages(rollcut.__path__, "rollcut."):
        if ".testing" in mod.name or mod.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(mod.name)
        except ImportError:
            continue  # an optional extra not installed: its errors are drawn or not, checked where it is
    drawn = _drawn()
    assert "ConfigError" in drawn, "the tree was read"
    # a private class never leaves its module (``bus._read``'s unanswered page request)
    public = {c for c in _every_subclass(RollcutError) if not c.__name__.startswith("_")}
    missing = sorted(c.__name__ for c in public if c.__name__ not in drawn)
    assert not missing, f"subclasses of RollcutError not drawn in rollcut._errors: {missing}"
    wrong = {
        c.__name__: (drawn[c.__name__], [b.__name__ for b in c.__bases__])
        for c in public
        if drawn[c.__name__] not in {b.__name__ for b in c.__bases__}
    }
    assert not wrong, f"drawn under a parent they do not have: {wrong}"
