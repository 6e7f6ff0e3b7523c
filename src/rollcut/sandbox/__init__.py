"""A sandbox's files across a crash: trees as manifests over content-addressed blobs stored once in
JetStream's object store (issue 32; ``docs/sandboxes.md``).

:func:`scan` makes a directory's manifest; :class:`BlobStore` stores the blobs a bucket lacks and
makes a manifest's tree again, every blob checked against its name; :func:`compact_blobs`
(run by the ledger's compaction) deletes the blobs no tree the stream still names needs.
"""

from ._blobs import BlobStore, LazyBlobStore, Stored, bucket_of
from ._collect import TREE_PROVIDER, BlobCompaction, compact_blobs, named_manifests
from ._manifest import (
    MAX_FILES,
    MAX_MANIFEST_BYTES,
    MAX_TREE_BYTES,
    Entry,
    Manifest,
    SnapshotError,
    Tree,
    decode_manifest,
    is_digest,
    scan,
    walk,
)

__all__ = [
    "MAX_FILES",
    "MAX_MANIFEST_BYTES",
    "MAX_TREE_BYTES",
    "TREE_PROVIDER",
    "BlobCompaction",
    "BlobStore",
    "Entry",
    "LazyBlobStore",
    "Manifest",
    "SnapshotError",
    "Stored",
    "Tree",
    "bucket_of",
    "compact_blobs",
    "decode_manifest",
    "is_digest",
    "named_manifests",
    "scan",
    "walk",
]
