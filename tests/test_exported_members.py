"""The public surface changes only on purpose.

As httpx does: every package's ``__all__`` is exactly its public names, and
the whole surface is pinned in ``public_api.txt`` beside this file, so an
export added or lost by accident fails here. Every exported name says in one
line what it is for.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import types
from pathlib import Path

import pytest

import rollcut
import rollcut.bus
import rollcut.ledger
import rollcut.replay

PACKAGES = [
    "rollcut",
    "rollcut.bus",
    "rollcut.tokens",
    "rollcut.replay",
    "rollcut.sandbox",
    "rollcut.ledger",
    "rollcut.participants",
    "rollcut.gym",
    "rollcut.gym.wire",
    "rollcut.gym.model",
    "rollcut.gym.model.engine",
    "rollcut.gym.resources",
    "rollcut.gym.agent",
    "rollcut.gym.opaque",
    "rollcut.collect",
    "rollcut.demo",
    "rollcut.testing",
    "rollcut.report",
    "rollcut.integrations",
    "rollcut.integrations.trl",
    "rollcut.bench",
    "rollcut.cli",
]
PINNED = Path(__file__).with_name("public_api.txt")


def _public(mod: types.ModuleType) -> set[str]:
    """Public names; in a plain module (not a package), only what it defines itself."""
    package = hasattr(mod, "__path__")
    return {
        n
        for n, v in vars(mod).items()
        if not n.startswith("_")
        and not isinstance(v, types.ModuleType)
        and n != "annotations"
        and (package or getattr(v, "__module__", mod.__name__) == mod.__name__)
    }


def test_every_exported_name_exists_and_is_public() -> None:
    for mod in (rollcut, rollcut.bus, rollcut.ledger, rollcut.replay):
        for name in mod.__all__:
            assert hasattr(mod, name), f"{mod.__name__}.{name}"
            assert not name.startswith("_") or name == "__version__"


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_exactly_the_public_names(name: str) -> None:
    mod = importlib.import_module(name)
    assert sorted(mod.__all__) == sorted(set(mod.__all__)), "duplicates in __all__"
    if hasattr(mod, "__getattr__"):  # a package whose names load on first use: load them all
        for n in mod.__all__:
            getattr(mod, n)
    assert set(mod.__all__) == _public(mod) | ({"__version__"} & set(mod.__all__))


def test_the_surface_is_the_pinned_one() -> None:
    have = sorted(f"{name}.{n}" for name in PACKAGES for n in importlib.import_module(name).__all__)
    pinned = [line for line in PINNED.read_text().splitlines() if line.strip()]
    added, lost = sorted(set(have) - set(pinned)), sorted(set(pinned) - set(have))
    assert (added, lost) == ([], []), "update tests/public_api.txt on purpose"


def _imported_from(init: Path) -> list[Path]:
    """The files a module's relative ``from … import`` statements name."""
    out = []
    for node in ast.walk(ast.parse(init.read_text())):  # a lazy name's import is under TYPE_CHECKING
        if isinstance(node, ast.ImportFrom) and node.level > 0 and node.module:
            base = init.parent
            for _ in range(node.level - 1):
                base = base.parent
            where = base.joinpath(*node.module.split("."))
            out += [f for f in (where.with_suffix(".py"), where / "__init__.py") if f.is_file()]
    return out


def _attribute_docs(mod: types.ModuleType) -> set[str]:
    """Names assigned at the top of the package's modules and followed by a docstring."""
    root = Path(inspect.getfile(mod))
    files = sorted(root.parent.glob("*.py")) if root.name == "__init__.py" else [root]
    files += _imported_from(root)  # a name re-exported from a module outside the package
    out: set[str] = set()
    for f in files:
        body = ast.parse(f.read_text()).body
        for stmt, nxt in itertools.pairwise(body):
            is_doc = isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
            if is_doc and isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                out |= {t.id for t in targets if isinstance(t, ast.Name)}
    return out


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_has_a_docstring(name: str) -> None:
    mod = importlib.import_module(name)
    documented = _attribute_docs(mod)
    missing = []
    for n in mod.__all__:
        obj = getattr(mod, n)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
            if not (doc or "").strip():
                missing.append(n)
        elif n not in documented and n != "__version__":
            missing.append(n)
    assert missing == [], f"{name}: no docstring for {missing}"


def test_every_error_derives_from_one_root() -> None:
    errors = [getattr(rollcut, n) for n in rollcut.__all__ if n.endswith("Error")]
    assert len(errors) >= 15
    assert all(issubclass(e, rollcut.RollcutError) for e in errors)
