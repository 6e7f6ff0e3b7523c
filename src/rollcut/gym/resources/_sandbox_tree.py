"""What a live sandbox session's tree may hold, checked after every call that can change it.

A checkpoint can keep only files, directories and symlinks, and a tool call copies the whole tree
(its draft), so a tree is bounded where a copy would pay for it, not only where a snapshot would:
in apparent bytes (a sparse file of 60 MB costs 16 KB on disk and 60 MB in the next call's copy)
and in entries. A call that leaves a FIFO, a socket or a device, or passes a bound, is refused and
undone (its draft goes; the session is as before it), named, so no session holds what the next
checkpoint could not keep, and no session's size grows past what a call may cost (issue 49).
"""

from __future__ import annotations

import shutil
import stat
import tempfile
from pathlib import Path

from ...sandbox import walk

__all__ = ["MAX_LIVE_BYTES", "MAX_LIVE_ENTRIES", "TreeRefused", "check_tree", "copy_tree"]

MAX_LIVE_BYTES = 1 << 30
"""A live session's files, in apparent bytes (what a draft's copy writes)."""
MAX_LIVE_ENTRIES = 100_000
"""A live session's paths."""

_KINDS = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


class TreeRefused(ValueError):
    """The call left the tree as a session may not hold it; the call is undone (a 400)."""


def check_tree(root: Path, *, max_bytes: int = MAX_LIVE_BYTES, max_entries: int = MAX_LIVE_ENTRIES) -> None:
    """Refuse a tree with anything but files, directories and symlinks, or past a bound."""
    total = 0
    for entries, (path, _, st) in enumerate(walk(root), start=1):
        kind = stat.S_IFMT(st.st_mode)
        if kind == stat.S_IFREG:
            total += st.st_size
        elif kind not in (stat.S_IFDIR, stat.S_IFLNK):
            raise TreeRefused(
                f"the call left {_KINDS.get(kind, 'a special file')} at {path!r}; a session keeps "
                "files, directories and symlinks only, so the call was undone"
            )
        if total > max_bytes or entries > max_entries:
            raise TreeRefused(
                f"the call left more than {max_bytes} bytes or {max_entries} paths in the tree "
                f"(sparse files count at their full size), so it was undone"
            )


def copy_tree(src: Path) -> Path:
    """A new private directory holding a copy of ``src`` (symlinks as symlinks); nothing left
    behind if the copy fails."""
    dst = Path(tempfile.mkdtemp(prefix="rollcut-sandbox-"))
    try:
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    except BaseException:
        shutil.rmtree(dst, ignore_errors=True)
        raise
    return dst
