"""A symlink is inside the tree only if it resolves inside it, component by component, through the
tree's own links (issue 49: ``d/up -> ..`` then ``esc -> d/up/../../etc`` passed a check of the
target's text, in the scan and in the decoder, and the restored link led out)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rollcut.sandbox import Entry, Manifest, SnapshotError, decode_manifest, scan


def _tree(root: Path, links: dict[str, str]) -> None:
    (root / "d").mkdir()
    (root / "file").write_text("x")
    for path, target in links.items():
        os.symlink(target, root / path)


@pytest.mark.parametrize(
    "links",
    [
        {"d/up": "..", "esc": "d/up/../../etc"},
        {"d/up": "..", "d/upup": "up/..", "esc": "d/upup/etc"},
        {"loop": "loop2", "loop2": "loop"},
    ],
)
def test_a_link_through_a_link_out_of_the_tree_is_refused_by_the_scan_and_the_decoder(
    tmp_path: Path, links: dict[str, str]
) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    _tree(root, links)
    with pytest.raises(SnapshotError, match="points out of the tree"):
        scan(root)
    entries = [Entry("d", "dir", 0o755), *(Entry(p, "symlink", 0o777, target=t) for p, t in links.items())]
    manifest = Manifest(sorted(entries, key=lambda e: e.path))
    with pytest.raises(SnapshotError, match="points out of the tree"):
        decode_manifest(manifest.encode())


def test_the_attack_is_real_on_disk_and_links_that_stay_inside_still_pass(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    _tree(root, {"d/up": "..", "esc": "d/up/../../etc", "ok": "d/up/file", "lib64": "d"})
    assert not (root / "esc").resolve().is_relative_to(root.resolve())  # out, as the kernel reads it
    os.unlink(root / "esc")
    made = scan(root).manifest
    assert decode_manifest(made.encode()) == made
    assert {e.path: e.target for e in made.entries if e.kind == "symlink"} == {
        "d/up": "..",
        "ok": "d/up/file",
        "lib64": "d",
    }
