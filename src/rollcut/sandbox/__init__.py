"""A sandbox's files across a crash: trees as manifests over content-addressed blobs stored once in
JetStream's object store (issue 32; ``docs/sandboxes.md``).

:func:`scan` makes a directory's manifest; :class:`BlobStore` stores the blobs a bucket lacks and
makes a manifest's tree again, every blob checked against its name; :meth:`BlobStore.compact`
deletes the blobs no kept manifest names.
"""

from ._blobs import BlobStore, Stored, bucket_of
from ._manifest import (
    MAX_FILES,
    MAX_MANIFEST_BYTES,
    MAX_TREE_BYTES,
    Entry,
    Manifest,
    SnapshotError,
    Tree,
    decode_manifest,
    scan,
)

__all__ = [
    "MAX_FILES",
    "MAX_MANIFEST_BYTES",
    "MAX_TREE_BYTES",
    "BlobStore",
    "Entry",
    "Manifest",
    "SnapshotError",
    "Stored",
    "Tree",
    "bucket_of",
    "decode_manifest",
    "scan",
]
