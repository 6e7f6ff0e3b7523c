"""Trees as manifests over content-addressed blobs in JetStream's object store (a real nats-server):
stored once, restored exactly, refused when a blob is missing or not what its name says, and
compacted down to what kept manifests name."""

from __future__ import annotations

import os
import random
from pathlib import Path

import msgspec
import pytest

from rollcut.bus import EventLog
from rollcut.sandbox import BlobStore, Entry, Manifest, SnapshotError, decode_manifest, scan


def _tree(root: Path, readme: bytes = b"# a task\n") -> Path:
    """A small task tree: a package with a failing test, an executable script, an empty file, a
    relative symlink and a nested directory."""
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "README.md").write_bytes(readme)
    (root / "pkg" / "__init__.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "pkg" / "sub" / "empty.txt").write_bytes(b"")
    (root / "test_add.py").write_text("from pkg import add\n\ndef test_add():\n    assert add(2, 2) == 4\n")
    (root / "run.sh").write_text("#!/bin/sh\npytest -q\n")
    os.chmod(root / "run.sh", 0o755)
    os.symlink("pkg/__init__.py", root / "main.py")
    # larger than one object-store chunk (128 KiB): read through a consumer, not one message get
    (root / "fixture.bin").write_bytes(random.Random(7).randbytes(300_000))
    return root


async def _blobs(log: EventLog, namespace: str) -> BlobStore:
    return await BlobStore.open(log.nc.jetstream(), namespace)


async def test_a_tree_restores_exactly_and_a_second_snapshot_stores_only_what_changed(
    log: EventLog, namespace: str, tmp_path: Path
) -> None:
    store = await _blobs(log, namespace)
    work = _tree(tmp_path / "work")
    first = scan(work)
    put = await store.put_tree(first)
    assert (put.blobs_put, put.blobs_reused) == (len(first.manifest.blobs()), 0)
    assert put.bytes_put == first.manifest.size()

    back = tmp_path / "back"
    assert await store.materialise(first.manifest, back) == first.manifest.size()
    assert scan(back).manifest == first.manifest  # paths, kinds, modes, sizes, digests, link targets
    assert os.readlink(back / "main.py") == "pkg/__init__.py" and os.access(back / "run.sh", os.X_OK)
    assert (back.stat().st_mode & 0o777) == 0o700

    # the agent fixes the bug and adds a file: a checkpoint stores those two blobs, nothing else
    (work / "pkg" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (work / "notes.txt").write_text("fixed the sign\n")
    second = scan(work)
    put = await store.put_tree(second)
    assert put.blobs_put == 2 and put.blobs_reused == len(second.manifest.blobs()) - 2
    assert second.manifest.digest() != first.manifest.digest()

    # another session seeded from the same task: every blob is already there
    other = await store.put_tree(scan(_tree(tmp_path / "other")))
    assert other.blobs_put == 0 and other.bytes_put == 0


async def test_a_missing_or_altered_blob_fails_the_restore_naming_the_path(
    log: EventLog, namespace: str, tmp_path: Path
) -> None:
    store = await _blobs(log, namespace)
    tree = scan(_tree(tmp_path / "work", readme=b"only in this tree\n"))
    await store.put_tree(tree)
    readme = next(e for e in tree.manifest.entries if e.path == "README.md")

    await store.store.put(readme.digest, b"someone else's bytes\n")  # a writer of the bucket lies
    with pytest.raises(SnapshotError, match=r"README.md: its blob .* is not what its name says"):
        await BlobStore(store.store, store.bucket, store.js).materialise(tree.manifest, tmp_path / "a")

    await store.store.delete(readme.digest)
    with pytest.raises(SnapshotError, match=r"README.md: its blob .* is missing") as err:
        await BlobStore(store.store, store.bucket, store.js).materialise(tree.manifest, tmp_path / "b")
    assert err.value.path == "README.md" and err.value.digest == readme.digest


async def test_compaction_keeps_every_blob_a_kept_manifest_names_and_frees_the_rest(
    log: EventLog, namespace: str, tmp_path: Path
) -> None:
    store = await _blobs(log, namespace)
    work = _tree(tmp_path / "work")
    old = scan(work)
    await store.put_tree(old)
    (work / "README.md").write_text("changed\n")
    new = scan(work)
    await store.put_tree(new)
    gone, kept = await store.compact([new.manifest])  # the old checkpoint is no longer kept
    assert (gone, kept) == (1, len(new.manifest.blobs()))
    assert await store.names() == new.manifest.blobs()
    await store.materialise(new.manifest, tmp_path / "back")  # the kept one still restores
    with pytest.raises(SnapshotError, match=r"README.md: its blob .* is missing"):
        await store.materialise(old.manifest, tmp_path / "old")


def _manifest(*entries: Entry) -> bytes:
    return msgspec.json.encode(Manifest(list(entries)))


_D = "ab" * 32


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([Entry("../etc/passwd", "file", 0o644, 1, _D)], "not a normal path"),
        ([Entry("/etc/passwd", "file", 0o644, 1, _D)], "not a normal path"),
        ([Entry("a/../../b", "file", 0o644, 1, _D)], "not a normal path"),
        ([Entry("a", "file", 0o644, 1, _D), Entry("a", "file", 0o644, 1, _D)], "appears twice"),
        ([Entry("a", "file", 0o644, 1, _D), Entry("a/b", "file", 0o644, 1, _D)], "parent of 'a/b'"),
        ([Entry("l", "symlink", 0o777, target="../../etc")], "points out of the tree"),
        ([Entry("l", "symlink", 0o777, target="/etc/passwd")], "points out of the tree"),
        ([Entry("f", "file", 0o644, 1, "not-a-digest")], "no SHA-256 digest"),
        ([Entry("f", "file", 0o17777, 1, _D)], "has mode"),
    ],
)
def test_a_manifest_that_leaves_its_tree_is_refused_before_anything_is_made(
    entries: list[Entry], why: str
) -> None:
    with pytest.raises(SnapshotError, match=why):
        decode_manifest(_manifest(*entries))


def test_a_manifest_that_is_not_one_is_refused_and_schema_1_still_reads(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="not a manifest"):
        decode_manifest(b'{"entries": [], "schema": 1, "extra": 0}')
    with pytest.raises(SnapshotError, match="schema 2"):
        decode_manifest(b'{"entries": [], "schema": 2}')
    old = (  # as the first release writes it
        b'{"entries":[{"path":"a","kind":"dir","mode":493,"size":0,"digest":"","target":""},'
        b'{"path":"a/f","kind":"file","mode":420,"size":3,'
        b'"digest":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad","target":""}],'
        b'"schema":1}'
    )
    m = decode_manifest(old)
    assert [e.path for e in m.entries] == ["a", "a/f"] and m.encode() == old
    (tmp_path / "t" / "a").mkdir(parents=True)
    (tmp_path / "t" / "a" / "f").write_bytes(b"abc")
    os.chmod(tmp_path / "t" / "a", 0o755)
    os.chmod(tmp_path / "t" / "a" / "f", 0o644)
    assert scan(tmp_path / "t").manifest == m  # the same tree scans to the same bytes


def test_a_tree_with_a_fifo_is_refused_naming_it(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(SnapshotError, match="pipe is not a file, a directory or a symlink"):
        scan(tmp_path)


async def test_a_writer_that_saw_blobs_before_a_compaction_stores_them_again_after_it(
    log: EventLog, namespace: str, tmp_path: Path
) -> None:
    """A resources server remembers which blobs the bucket holds; a compaction in another process
    may delete them meanwhile. Its next tree checks the bucket again, so nothing names a blob gone."""
    writer, compactor = await _blobs(log, namespace), await _blobs(log, namespace)
    tree = scan(_tree(tmp_path / "work"))
    first = await writer.put_tree(tree)
    assert first.blobs_put == len(tree.manifest.blobs())
    assert (await writer.put_tree(tree)).blobs_put == 0  # seen: not asked for or stored again
    gone, _ = await compactor.compact([])  # no kept tree names them: all go
    assert gone == first.blobs_put
    again = await writer.put_tree(tree)
    assert (again.blobs_put, again.blobs_reused) == (first.blobs_put, 0)
    await writer.materialise(tree.manifest, tmp_path / "back")  # whole again
