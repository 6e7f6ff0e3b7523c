"""Check an LMDB file before it is mapped: a truncated file must be an error, not SIGBUS.

LMDB maps its data file and reads pages through the mapping; a page beyond the
end of a truncated file kills the process with SIGBUS (exit 135) instead of
raising. Its two meta pages record the last page in use (``mm_last_pg``) and
the page size, so the size the file must have is known before mapping it.
"""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path
from typing import Any, Self

from ._errors import StorageError

__all__ = ["LmdbFile", "lmdb_problem", "storage_error"]

# what a full, read-only, over-quota or failing disk makes LMDB report
_STORAGE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO, errno.EROFS)

_MAGIC = 0xBEEFC0DE
_META = 16  # the page header before each meta (pgno 8, pad 2, flags 2, lower 2, upper 2)


def lmdb_problem(data_file: Path) -> str | None:
    """Why the LMDB data file cannot be mapped safely, or None (also None when it does not exist yet)."""
    try:
        size = data_file.stat().st_size
        with data_file.open("rb") as f:
            head = f.read(2 * 65536)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read {data_file}: {exc.strerror or exc}"
    if size == 0:
        return None
    best: tuple[int, int] | None = None  # (txnid, bytes needed) of the newest valid meta
    for offset in _meta_offsets(head):
        if len(head) < offset + _META + 152:
            continue
        magic = struct.unpack_from("<I", head, offset + _META)[0]
        if magic != _MAGIC:
            continue
        psize = struct.unpack_from("<I", head, offset + _META + 24)[0]
        last_pg, txnid = struct.unpack_from("<QQ", head, offset + _META + 120)
        if psize and (best is None or txnid > best[0]):
            best = (txnid, (last_pg + 1) * psize)
    if best is None:
        return f"{data_file} is not an LMDB file (no valid meta page)"
    if size < best[1]:
        return f"{data_file} is truncated: {size} bytes, its last page ends at {best[1]}"
    return None


def _meta_offsets(head: bytes) -> list[int]:
    # the second meta page starts one page in; the page size is in the first meta
    if len(head) < _META + 28:
        return [0]
    psize = struct.unpack_from("<I", head, _META + 24)[0]
    return [0, psize] if 0 < psize <= 65536 else [0]


def storage_error(exc: Exception, path: Path, doing: str) -> StorageError | None:
    """The StorageError an LMDB failure is, when the disk under it failed (LMDB reports only the
    system's message, so it is matched by its text); None for any other failure."""
    text = str(exc)
    for code in _STORAGE_ERRNOS:
        if os.strerror(code) in text:
            return StorageError(f"cannot {doing} at {path}: {text}", path=str(path), errno=code)
    return None


class LmdbFile:
    """What every LMDB-backed store (the ledger, the local token store) does with its environment:
    close it, also as a context manager."""

    env: Any

    def close(self) -> None:
        """Close the LMDB environment."""
        self.env.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
