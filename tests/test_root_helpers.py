"""The root helpers import no package (an import-linter contract in ``pyproject.toml``): every root
module is in that contract, but the two that are not helpers by design (``_home``: where a bus
home is, opened through ``bus``; ``__main__``: the command line)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import rollcut

ROOT = Path(__file__).resolve().parents[1]
NOT_HELPERS = {"rollcut._home", "rollcut.__main__", "rollcut.__init__"}


def test_every_root_module_is_in_the_root_helpers_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = [
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c["name"] == "the root helpers import no package"
    ]
    root = Path(rollcut.__file__).parent
    modules = {f"rollcut.{p.stem}" for p in root.glob("*.py")} - NOT_HELPERS
    assert modules - set(contract["source_modules"]) == set(), "a root module outside the contract"
    assert set(contract["source_modules"]) <= modules, "the contract names a module that is gone"
    packages = {f"rollcut.{p.name}" for p in root.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(contract["forbidden_modules"]), "every package is forbidden to the helpers"
