"""Content-addressed blobs in JetStream's object store: a tree stored once, restored exactly.

One bucket per namespace (``rc_<namespace>_blobs``, file storage, the stream's replicas); a blob's
name is the SHA-256 of its content. Storing a tree puts only the blobs the bucket does not hold,
so a checkpoint costs what changed since any tree stored before, and sessions seeded from the same
task share their blobs.

The name is a claim, not a proof: whoever can write the bucket can put other bytes under a name.
So a blob is checked against its name every time it is read (:meth:`BlobStore.fetch`), and a
restore that meets a missing or wrong blob fails naming the path (:class:`SnapshotError`): the
caller starts the rollout over rather than continue from files that are not the cut's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.js.api import ObjectStoreConfig, StorageType, StoreCompression
from nats.js.errors import NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from .._errors import ConfigError
from ..bus import EventLog, Subjects
from ._manifest import Manifest, SnapshotError, Tree, decode_manifest, is_digest

__all__ = ["BlobStore", "LazyBlobStore", "Stored", "bucket_of"]

_PARALLEL = 16  # blobs asked for at once: one round trip each
_EPOCH = "compaction"
"""The object a compaction rewrites before it deletes anything: a writer that sees it changed
forgets which blobs it had seen (they may be gone). Not a digest, so never a blob."""


def bucket_of(namespace: str) -> str:
    """The namespace's blob bucket (a JetStream object store)."""
    return Subjects(namespace).blob_bucket


@dataclass(frozen=True)
class Stored:
    """What storing a tree cost: blobs and bytes put now, and those the bucket already held."""

    blobs_put: int
    bytes_put: int
    blobs_reused: int
    bytes_reused: int


class BlobStore:
    """A namespace's blobs (see the module's docstring)."""

    def __init__(self, store: ObjectStore, bucket: str, js: Any) -> None:
        self.store, self.bucket, self.js = store, bucket, js
        self._known: set[str] = set()  # blobs seen in the bucket since the last compaction began
        self._epoch: str | None = None
        self._limit = asyncio.Semaphore(_PARALLEL)

    @classmethod
    async def open(cls, js: Any, namespace: str, *, replicas: int = 1) -> BlobStore:
        """The namespace's bucket, created on first use. ``js``: a JetStream context."""
        bucket = bucket_of(namespace)
        try:
            store = await js.object_store(bucket)
        except NotFoundError:
            config = ObjectStoreConfig(bucket=bucket, storage=StorageType.FILE, replicas=replicas)
            store = await js.create_object_store(bucket, config=config)
            # compressed on disk (S2): source trees compress several times over, and the blobs are
            # stored as they are (nats-py's bucket settings do not reach the stream's compression)
            stream = (await js.stream_info(f"OBJ_{bucket}")).config
            stream.compression = StoreCompression.S2
            await js.update_stream(stream)
        return cls(store, bucket, js)

    @classmethod
    async def existing(cls, js: Any, namespace: str) -> BlobStore | None:
        """The namespace's bucket if it has one (compaction must not create it)."""
        bucket = bucket_of(namespace)
        try:
            return cls(await js.object_store(bucket), bucket, js)
        except NotFoundError:
            return None

    async def _fresh(self) -> None:
        """Forget the blobs seen before a compaction that began since (they may be deleted)."""
        try:
            epoch: str | None = (await self.store.get_info(_EPOCH)).nuid
        except ObjectNotFoundError:
            epoch = None
        if epoch != self._epoch:
            self._known.clear()
            self._epoch = epoch

    async def has(self, digest: str) -> bool:
        if digest in self._known:
            return True
        try:
            async with self._limit:
                await self.store.get_info(digest)
        except ObjectNotFoundError:
            return False
        self._known.add(digest)
        return True

    async def put_tree(self, tree: Tree) -> Stored:
        """Every blob of ``tree`` the bucket lacks, put; each read again and checked first (a file
        changed since the scan is refused, not stored under a name that is not its content's)."""
        await self._fresh()
        return await self._put_blobs(tree)

    async def put_snapshot(self, tree: Tree) -> Stored:
        """What a checkpoint stores of a tree: its blobs the bucket lacks, then its manifest (a
        tree's record names only that); ``bytes_put`` counts the manifest's bytes when it was put."""
        await self._fresh()
        stored = await self._put_blobs(tree)
        manifest_bytes = await self._put_manifest(tree.manifest)
        return dataclasses.replace(stored, bytes_put=stored.bytes_put + manifest_bytes)

    async def _put_blobs(self, tree: Tree) -> Stored:
        sizes = {e.digest: e.size for e in tree.manifest.entries if e.kind == "file"}
        present = await asyncio.gather(*(self.has(d) for d in sizes))
        missing = [d for d, there in zip(sizes, present, strict=True) if not there]
        await asyncio.gather(*(self._put(d, tree.sources[d]) for d in missing))
        reused = [d for d in sizes if d not in missing]
        return Stored(
            blobs_put=len(missing),
            bytes_put=sum(sizes[d] for d in missing),
            blobs_reused=len(reused),
            bytes_reused=sum(sizes[d] for d in reused),
        )

    async def _put_manifest(self, manifest: Manifest) -> int:
        """The manifest as a blob named by its digest: the bytes put, 0 when the bucket held it."""
        name = manifest.digest()
        if await self.has(name):
            return 0
        encoded = manifest.encode()
        async with self._limit:
            await self.store.put(name, encoded)
        self._known.add(name)
        return len(encoded)

    async def _put(self, digest: str, source: Path) -> None:
        data = await asyncio.to_thread(source.read_bytes)
        if hashlib.sha256(data).hexdigest() != digest:
            raise SnapshotError(f"{source} changed while it was being snapshotted", digest=digest)
        async with self._limit:
            await self.store.put(digest, data)
        self._known.add(digest)

    async def fetch(self, digest: str, *, path: str = "") -> bytes:
        """The blob named ``digest``, checked against its name."""
        where = path or digest
        try:
            async with self._limit:
                data = await self._read(digest)
        except ObjectNotFoundError as exc:
            raise SnapshotError(
                f"{where}: its blob {digest[:12]} is missing", path=path, digest=digest
            ) from exc
        except Exception as exc:  # torn chunks, a stream that stopped answering
            raise SnapshotError(
                f"{where}: its blob {digest[:12]} does not read: {exc!r}", path=path, digest=digest
            ) from exc
        if hashlib.sha256(data).hexdigest() != digest:
            raise SnapshotError(
                f"{where}: its blob {digest[:12]} is not what its name says", path=path, digest=digest
            )
        return data

    async def _read(self, name: str) -> bytes:
        """An object's bytes: its metadata, then its one chunk by a message get, or its chunks
        through an ordered consumer on the bucket's stream, named (nats-py's own ``get`` looks the
        stream up by subject, which needs the right to list every stream's name: a resources
        server is not given it)."""
        info = await self.store.get_info(name)
        if not info.size:
            return b""
        chunk_subject = f"$O.{self.bucket}.C.{info.nuid}"
        if info.chunks == 1:  # most files of a tree: one message, one request
            msg = await self.js.get_last_msg(f"OBJ_{self.bucket}", chunk_subject)
            return bytes(msg.data or b"")
        sub = await self.js.subscribe(chunk_subject, stream=f"OBJ_{self.bucket}", ordered_consumer=True)
        data = bytearray()

        async def chunks() -> None:
            async for msg in sub.messages:
                data.extend(msg.data)
                if msg.metadata.num_pending == 0:
                    return

        try:  # chunks purged under their metadata would be waited for forever
            await asyncio.wait_for(chunks(), timeout=30.0 + info.size / (1 << 20))
        finally:
            await sub.unsubscribe()
        return bytes(data)

    async def manifest(self, digest: str) -> Manifest:
        """The manifest named ``digest``, checked against its name and decoded bounded."""
        return decode_manifest(await self.fetch(digest, path="(manifest)"))

    async def make(self, digest: str, dest: Path) -> int:
        """Make the tree whose manifest is named ``digest`` at ``dest``, as :meth:`materialise`."""
        return await self.materialise(await self.manifest(digest), dest)

    async def materialise(self, manifest: Manifest, dest: Path) -> int:
        """Make the tree of ``manifest`` at ``dest`` (a new directory, 0700), every file checked
        against its digest before it is written; the bytes written. On any failure ``dest`` is left
        incomplete for the caller to remove: it must not be used."""
        files = [e for e in manifest.entries if e.kind == "file"]
        contents = await asyncio.gather(*(self.fetch(e.digest, path=e.path) for e in files))
        await asyncio.to_thread(
            _write_tree, manifest, dest, dict(zip((e.path for e in files), contents, strict=True))
        )
        return sum(len(d) for d in contents)

    async def names(self) -> set[str]:
        """Every blob in the bucket."""
        with contextlib.suppress(NotFoundError):
            listed = await self.store.list(ignore_deletes=True)
            return {i.name for i in listed if i.name and not i.deleted and is_digest(i.name)}
        return set()

    async def compact(self, keep: Iterable[Manifest], *, also: Iterable[str] = ()) -> tuple[int, int]:
        """Delete every blob no manifest in ``keep`` names (the trees of every kept checkpoint)
        and that is not in ``also`` (the manifests themselves); (blobs deleted, blobs kept).
        The epoch is moved first, so a writer's next tree checks the bucket again."""
        needed: set[str] = set(also).union(*(m.blobs() for m in keep))
        await self.store.put(_EPOCH, os.urandom(16))
        have = await self.names()
        gone = sorted(have - needed)
        for name in gone:
            await self.store.delete(name)
            self._known.discard(name)
        return len(gone), len(have & needed)


class LazyBlobStore:
    """The namespace's bucket, opened on its first use from a log bound later: an environment or a
    sandbox provider is made before the worker's log exists, and most never store a tree."""

    def __init__(self) -> None:
        self.log: EventLog | None = None
        self._store: BlobStore | None = None
        self._lock = asyncio.Lock()

    def bind(self, log: EventLog) -> None:
        self.log = log

    async def get(self) -> BlobStore:
        async with self._lock:
            if self._store is None:
                if self.log is None:
                    raise ConfigError("trees are stored beside the log: no log bound")
                self._store = await BlobStore.open(self.log.nc.jetstream(), self.log.subjects.namespace)
            return self._store


def _write_tree(manifest: Manifest, dest: Path, contents: dict[str, bytes]) -> None:
    """The tree on disk: directories (sorted by path, so before what is in them), files (created,
    never through a symlink), symlinks, and directory modes last (a read-only one still got its
    files)."""
    dest.mkdir(mode=0o700)
    for e in manifest.entries:
        if e.kind == "dir":
            (dest / e.path).mkdir(mode=0o700)
    for e in manifest.entries:
        if e.kind == "file":
            target = dest / e.path
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(contents[e.path])
            os.chmod(target, e.mode)
        elif e.kind == "symlink":
            os.symlink(e.target, dest / e.path)
    for e in reversed(manifest.entries):
        if e.kind == "dir":
            os.chmod(dest / e.path, e.mode)
