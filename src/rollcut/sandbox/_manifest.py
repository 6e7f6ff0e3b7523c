"""A directory as a manifest: every path with its kind, mode, size, content digest or link target.

A sandbox's state is its files. Archiving the whole tree at every checkpoint costs the tree each
time; a manifest over content-addressed blobs costs only what changed since the blobs already
stored (and sessions seeded from one tree share theirs). The manifest is small, canonical
(entries sorted by path, one encoding) and has a digest of its own, which is what the log records.

Nothing in a manifest is trusted when it is read back: :func:`decode_manifest` is bounded and
refuses a path that is absolute, climbs (``..``), repeats, or hangs below something that is not a
directory, and a symlink whose target is absolute or resolves outside the tree, following the
tree's own symlinks as the kernel would. A tree with
anything but files, directories and symlinks (a device, a FIFO, a socket) is refused when
scanned, naming the path: it could not be restored.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from .._errors import RollcutError

__all__ = [
    "MAX_FILES",
    "MAX_MANIFEST_BYTES",
    "MAX_TREE_BYTES",
    "Entry",
    "Manifest",
    "SnapshotError",
    "Tree",
    "decode_manifest",
    "is_digest",
    "scan",
    "walk",
]

MAX_FILES = 200_000
"""Entries in one tree (a large repository has tens of thousands)."""
MAX_TREE_BYTES = 4 << 30
"""Bytes of file content in one tree."""
MAX_MANIFEST_BYTES = 64 << 20
"""An encoded manifest read back (about 300 bytes an entry at ``MAX_FILES``)."""


class SnapshotError(RollcutError):
    """A tree cannot be snapshotted, or a snapshot cannot be restored exactly (a blob missing or
    not what its name says, a manifest that is not one)."""

    path: str | None = None
    digest: str | None = None


class Entry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One path of the tree. ``digest`` (SHA-256, hex) and ``size`` are a file's; ``target`` a
    symlink's; ``mode`` the permission bits."""

    path: str
    kind: Literal["file", "dir", "symlink"]
    mode: int
    size: int = 0
    digest: str = ""
    target: str = ""


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A tree, as its entries sorted by path (schema 1)."""

    entries: list[Entry]
    schema: int = 1

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    def digest(self) -> str:
        """The manifest's identity: the SHA-256 of its one encoding."""
        return hashlib.sha256(self.encode()).hexdigest()

    def blobs(self) -> set[str]:
        """The content digests the tree needs."""
        return {e.digest for e in self.entries if e.kind == "file"}

    def size(self) -> int:
        return sum(e.size for e in self.entries if e.kind == "file")


@dataclass(frozen=True)
class Tree:
    """A scanned tree: its manifest, and where on disk each blob's content was found."""

    manifest: Manifest
    sources: dict[str, Path]  # digest -> a file holding it


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def walk(root: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
    """Every path below ``root``: its path relative to ``root``, where it is, and its own status
    (symlinks not followed, directories descended into)."""
    stack = [(root, "")]
    while stack:
        where, rel = stack.pop()
        with os.scandir(where) as it:
            for d in it:
                st = d.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    stack.append((Path(d.path), f"{rel}{d.name}/"))
                yield f"{rel}{d.name}", Path(d.path), st


def scan(root: Path, *, max_files: int = MAX_FILES, max_bytes: int = MAX_TREE_BYTES) -> Tree:
    """The manifest of the tree under ``root`` (``root`` itself is not an entry). Symlinks are
    recorded, never followed."""
    entries: list[Entry] = []
    sources: dict[str, Path] = {}
    total = 0
    for path, where, st in walk(root):
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            entries.append(Entry(path, "symlink", mode, target=os.readlink(where)))
        elif stat.S_ISDIR(st.st_mode):
            entries.append(Entry(path, "dir", mode))
        elif stat.S_ISREG(st.st_mode):
            total += st.st_size
            if total > max_bytes:
                raise SnapshotError(f"the tree holds more than {max_bytes} bytes", path=path)
            digest = _sha256(where)
            sources.setdefault(digest, where)
            entries.append(Entry(path, "file", mode, size=st.st_size, digest=digest))
        else:
            raise SnapshotError(f"{path} is not a file, a directory or a symlink", path=path)
        if len(entries) > max_files:
            raise SnapshotError(f"the tree holds more than {max_files} entries", path=path)
    entries.sort(key=lambda e: e.path)
    manifest = Manifest(entries)
    _check(manifest)  # what a scan makes must also read back (a symlink out of the tree does not)
    return Tree(manifest, sources)


def decode_manifest(data: bytes) -> Manifest:
    """A manifest read back from storage, checked before anything is made of it."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise SnapshotError(f"a manifest of {len(data)} bytes (at most {MAX_MANIFEST_BYTES})")
    try:
        manifest = msgspec.json.decode(data, type=Manifest)
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"not a manifest: {exc}") from exc
    if manifest.schema != 1:
        raise SnapshotError(f"manifest schema {manifest.schema}: this rollcut reads schema 1")
    if len(manifest.entries) > MAX_FILES:
        raise SnapshotError(f"a manifest of {len(manifest.entries)} entries (at most {MAX_FILES})")
    _check(manifest)
    return manifest


def is_digest(name: str) -> bool:
    """Whether ``name`` is a SHA-256 in lowercase hex: a blob's or a manifest's name."""
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def _check(manifest: Manifest) -> None:
    """Every path relative, normal and once; every parent a directory of the tree; every symlink's
    target inside the tree; every file's digest a SHA-256."""
    kinds: dict[str, str] = {}
    for e in manifest.entries:
        p = e.path
        if not p or "\x00" in p or p.startswith("/") or posixpath.normpath(p) != p or p.split("/")[0] == "..":
            raise SnapshotError(f"the path {p!r} is not a normal path inside the tree", path=p)
        if p in kinds:
            raise SnapshotError(f"the path {p!r} appears twice", path=p)
        parent = posixpath.dirname(p)
        if parent and kinds.get(parent) != "dir":
            raise SnapshotError(f"the parent of {p!r} is not a directory listed before it", path=p)
        kinds[p] = e.kind
        if not 0 <= e.mode <= 0o7777 or e.size < 0:
            raise SnapshotError(f"{p!r} has mode {e.mode:o} and size {e.size}", path=p)
        if e.kind == "file" and not is_digest(e.digest):
            raise SnapshotError(f"{p!r} has no SHA-256 digest", path=p, digest=e.digest)
        if e.kind == "symlink":
            t = e.target
            if not t or "\x00" in t or t.startswith("/"):
                raise SnapshotError(f"the symlink {p!r} points out of the tree ({t!r})", path=p)
    links = {e.path: e.target for e in manifest.entries if e.kind == "symlink"}
    for p, t in links.items():
        if not _stays_inside(posixpath.dirname(p), t, links):
            raise SnapshotError(f"the symlink {p!r} points out of the tree ({t!r})", path=p)


_MAX_HOPS = 40
"""Symlinks followed resolving one target (Linux's own limit)."""


def _stays_inside(where: str, target: str, links: dict[str, str]) -> bool:
    """Whether ``target``, read in the directory ``where``, resolves inside the tree as the kernel
    would resolve it: every component in turn, a symlink of the tree followed where it stands (so
    ``d/up -> ..`` then ``d/up/../../etc`` is out, which a lexical check of the string misses)."""
    parts = [c for c in where.split("/") if c]
    pending = target.split("/")
    hops = 0
    while pending:
        c = pending.pop(0)
        if c in ("", "."):
            continue
        if c == "..":
            if not parts:
                return False
            parts.pop()
            continue
        path = "/".join([*parts, c])
        if path in links:
            hops += 1
            t = links[path]
            if hops > _MAX_HOPS or t.startswith("/"):
                return False
            pending = t.split("/") + pending  # read where the link stands: ``parts`` stays
            continue
        parts.append(c)
    return True
