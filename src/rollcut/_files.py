"""Files that hold secrets or user data: 0600, in directories only their owner can enter (0700).

Credentials, the server's config, the ledger, the token store (every prompt and
output) and a collection's rows are all of that kind; a world-readable default
umask must never leak them.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import TypeVar

import msgspec

from ._errors import ConfigError

__all__ = [
    "PRIVATE_DIR",
    "PRIVATE_FILE",
    "append_private",
    "file_sha256",
    "private_dir",
    "read_bounded",
    "read_record",
    "write_private",
]

T = TypeVar("T")

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner can enter (created with its parents if absent)."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    os.chmod(path, PRIVATE_DIR)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably, readable by its owner only: the
    file is fsynced before the rename and its directory after it (without the second, a power
    loss can keep the old file, or none, even though the call returned). A symlink at ``path``
    is replaced itself, never followed (its target is left as it was); one planted at the
    temporary name is refused (``O_NOFOLLOW``)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, PRIVATE_FILE)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _regular(path: Path) -> int:
    """An open descriptor of ``path`` if it is a regular file (not a FIFO, a device or a link to
    one: opening neither blocks nor follows a last-component symlink); OSError if not."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return fd


def file_sha256(path: Path) -> str:
    """The SHA-256 of a regular file's bytes, read in blocks (model files are hundreds of MB)."""
    with os.fdopen(_regular(path), "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def read_bounded(path: Path, limit: int) -> bytes:
    """A regular file's bytes, its size checked before any is read: a FIFO, a device or a link is
    an OSError, so is a file over ``limit`` bytes (nothing of it is read)."""
    with os.fdopen(_regular(path), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise OSError(f"{path} holds {size} bytes, more than {limit}")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{path} grew past {limit} bytes while read")
    return data


def append_private(path: Path, data: bytes) -> None:
    """Append ``data`` durably (fsync) to ``path``, created readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE)
    with os.fdopen(fd, "ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read_record(path: Path, kind: type[T], what: str) -> T:
    """A JSON record rollcut wrote (credentials, a cluster layout), as its struct; a missing or
    invalid file is a ConfigError naming ``what`` it should have been."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except FileNotFoundError as exc:
        raise ConfigError(f"no {what} at {path}") from exc
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"{what} {path} is not valid: {exc}") from exc
