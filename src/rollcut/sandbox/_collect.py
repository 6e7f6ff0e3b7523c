"""Blob compaction: the bucket keeps the blobs of every tree the stream still names, and lets the
rest go.

The roots are the manifests named on the stream as it stands after the ledger's compaction: every
resources session's state record that names one (``{"manifest": SHA-256, ...}``: the ``sandbox``
environment's, or any environment's that stores its trees here) and every opaque agent's
``agent.sandbox`` record of the ``tree`` provider. A kept checkpoint's restore reads only records
at or below its cut of rollouts that were not compacted, so each tree it can make is a root; the
records of rollouts compacted away (accepted below the oldest kept checkpoint) are gone from the
stream, and their trees' blobs go unless another root shares them.

Why it is safe beside live sessions: a sandbox puts blobs only at a checkpoint's prepare (a seeded
tree is named, not stored), and the collection compacts between checkpoints, under the lock its
checkpoints take, after the checkpoint's records are on the stream. A writer that had seen a blob
before this compaction checks the bucket again (the epoch object moves first). A manifest that no
longer reads keeps its own name and frees nothing of its tree it cannot see: a restore from it
fails closed either way.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import msgspec

from ..bus import AgentSandbox, EventLog, ResourcesMutated, ResourcesSeeded, ResourcesSnapshot
from ._blobs import BlobStore
from ._manifest import Manifest, SnapshotError, is_digest

__all__ = ["TREE_PROVIDER", "BlobCompaction", "compact_blobs", "named_manifests"]

TREE_PROVIDER = "tree"
"""The built-in opaque-agent sandbox provider whose ``agent.sandbox`` records name manifests."""

_MAX_RECORD = 64 * 1024  # a state record that names a manifest is small; a larger state is not one


class _Names(msgspec.Struct):
    manifest: str = ""


@dataclass(frozen=True)
class BlobCompaction:
    """What a blob compaction did: the roots it kept, the blobs deleted and kept."""

    manifests: int
    blobs_deleted: int
    blobs_kept: int


def _manifest_in(state: bytes | None) -> str | None:
    if not state or len(state) > _MAX_RECORD or not state.startswith(b"{"):
        return None
    try:
        name = msgspec.json.decode(state, type=_Names).manifest
    except msgspec.DecodeError:
        return None
    return name if is_digest(name) else None


async def named_manifests(log: EventLog) -> set[str]:
    """Every manifest a record on the stream names (see the module's docstring)."""
    names: set[str] = set()
    async for page in log.read_pages(component="resources", strict=False):
        for stored in page:
            ev = stored.event
            if isinstance(ev, ResourcesSeeded | ResourcesMutated | ResourcesSnapshot):
                name = _manifest_in(ev.state)
                if name is not None:
                    names.add(name)
    async for page in log.read_pages(component="agent", strict=False):
        for stored in page:
            ev = stored.event
            if isinstance(ev, AgentSandbox) and ev.provider == TREE_PROVIDER and is_digest(ev.ref):
                names.add(ev.ref)
    return names


async def compact_blobs(log: EventLog) -> BlobCompaction | None:
    """Delete the namespace's blobs no tree on the stream needs; None where it has no bucket."""
    blobs = await BlobStore.existing(log.nc.jetstream(), log.subjects.namespace)
    if blobs is None:
        return None
    roots = await named_manifests(log)

    async def tree(name: str) -> Manifest | None:
        try:
            return await blobs.manifest(name)
        except SnapshotError:
            return None  # missing or not a manifest: nothing to keep for it but its name

    read = await asyncio.gather(*(tree(name) for name in roots))  # the store bounds how many at once
    deleted, kept = await blobs.compact([m for m in read if m is not None], also=roots)
    return BlobCompaction(manifests=len(roots), blobs_deleted=deleted, blobs_kept=kept)
