"""The public surface changes only on purpose."""

from __future__ import annotations

import rollcut
import rollcut.bus
import rollcut.ledger
import rollcut.replay


def test_every_exported_name_exists_and_is_public() -> None:
    for mod in (rollcut, rollcut.bus, rollcut.ledger, rollcut.replay):
        for name in mod.__all__:
            assert hasattr(mod, name), f"{mod.__name__}.{name}"
            assert not name.startswith("_") or name == "__version__"


def test_every_error_derives_from_one_root() -> None:
    errors = [getattr(rollcut, n) for n in rollcut.__all__ if n.endswith("Error")]
    assert len(errors) >= 15
    assert all(issubclass(e, rollcut.RollcutError) for e in errors)
