"""A collection's rollouts and the rows it has written: memory that follows the running.

A week's collection names millions of rollouts. Holding each one's input row, identity and
written digest in dicts cost the collector about 1.5 KB per rollout it had ever seen
(issue 33). Past :data:`SPILL_AT` rollouts they move to a private LMDB environment beside the
output, which the collection builds when it starts and deletes when it ends; the collector keeps
in memory only the rollouts it is running. A small collection keeps its index in dicts (a few
MB at most, and no file a full disk could refuse before the first row).

The index is derived (from the tasks and the output rows), never a source of truth: every
collector rebuilds it, so it is written without fsync, in a fresh directory of its own (0700,
named for its host and process) that no second collector shares; one a killed collector of this
host left behind is deleted by the next.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import shutil
import socket
import struct
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import msgspec

from .._errors import ConfigError, RollcutError
from .._lmdb import storage_error
from .._process import pid_alive
from ..bus import input_digest
from ..gym.wire import NG_ATTEMPT_INDEX, NG_ROLLOUT_ID, NG_ROLLOUT_INDEX, NG_TASK_INDEX

__all__ = ["SPILL_AT", "Inputs", "RolloutInput", "Written", "is_nemo_row"]

_TASK_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
_CHUNK = 4096  # rows per write transaction, and keys per read: LMDB holds a write's dirty pages in memory
_POS = struct.Struct(">Q")  # big-endian, so LMDB's byte order is input order
_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()
_kept = msgspec.msgpack.Decoder(tuple[str, float])
_where = msgspec.msgpack.Decoder(tuple[int, int, int])


def is_nemo_row(row: dict[str, Any]) -> bool:
    """Whether a row is in NeMo Gym's shape."""
    return "responses_create_params" in row


@dataclass(frozen=True)
class RolloutInput:
    """One rollout to collect: its row, and where it came from."""

    rollout_id: str
    row: dict[str, Any]
    task_index: int
    repeat: int

    @property
    def nemo(self) -> bool:
        """Whether the row is NeMo Gym-shaped."""
        return is_nemo_row(self.row)

    def ng_fields(self, attempt: int) -> dict[str, Any]:
        """NeMo Gym's identity fields for ``attempt`` (rollcut's attempt 1 is NeMo Gym's index 0)."""
        return {
            NG_TASK_INDEX: self.task_index,
            NG_ROLLOUT_INDEX: self.repeat,
            NG_ROLLOUT_ID: self.rollout_id,
            NG_ATTEMPT_INDEX: attempt - 1,
        }


_DBS = ("where", "rows", "order", "written", "distinct", "ids", "repeats")
SPILL_AT = 8192
"""Rollouts beyond which a collection's index moves from memory to disk (8,192: a few MB at most)."""


class _Memory:
    """The index of a small collection: dicts (a few MB at most, and no file a full disk can refuse)."""

    def __init__(self) -> None:
        self.dbs: dict[str, dict[bytes, bytes]] = {name: {} for name in _DBS}

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        yield

    def get(self, db: str, key: bytes) -> bytes | None:
        return self.dbs[db].get(key)

    def put(self, db: str, key: bytes, value: bytes, *, overwrite: bool = True) -> bool:
        if not overwrite and key in self.dbs[db]:
            return False
        self.dbs[db][key] = value
        return True

    def delete(self, db: str, key: bytes) -> bool:
        return self.dbs[db].pop(key, None) is not None

    def items(self, db: str) -> Iterator[tuple[bytes, bytes]]:
        return iter(list(self.dbs[db].items()))  # a snapshot: puts meanwhile do not break the iteration

    def count(self, db: str) -> int:
        return len(self.dbs[db])

    def clear(self, db: str) -> None:
        self.dbs[db].clear()

    def close(self) -> None:
        self.dbs = {name: {} for name in _DBS}


def _remove(env: lmdb.Environment, folder: str) -> None:
    env.close()
    shutil.rmtree(folder, ignore_errors=True)


def _sweep(near: Path, host: str) -> None:
    """Delete the indexes that collectors of this host, now dead, left beside the output."""
    with contextlib.suppress(OSError):
        for old in near.glob(f".rollcut-index-{host}-*-*"):
            pid = old.name[len(f".rollcut-index-{host}-") :].split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(old, ignore_errors=True)


def _failed(exc: Exception, folder: str) -> RollcutError:
    """An index write that failed: a StorageError when the disk refused it (exit 74)."""
    return storage_error(exc, Path(folder), "write the collection's index") or RollcutError(
        f"the collection's index at {folder} failed: {exc}"
    )


class _Disk:
    """The index of a large collection: a private LMDB environment beside the output (the disk meant
    for the collection), deleted when the index goes. Derived data, rebuilt by every collector: no
    fsync. One write transaction per :meth:`batch`, or per write outside one."""

    def __init__(self, near: Path) -> None:
        host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:64]
        _sweep(near, host)
        try:
            self.folder = tempfile.mkdtemp(prefix=f".rollcut-index-{host}-{os.getpid()}-", dir=near)  # 0700
            self.env = lmdb.open(
                self.folder, map_size=1 << 38, max_dbs=len(_DBS), sync=False, metasync=False, mode=0o600
            )
        except (OSError, lmdb.Error) as exc:
            raise _failed(exc, str(near)) from exc
        self.db = {name: self.env.open_db(name.encode()) for name in _DBS}
        self._final = weakref.finalize(self, _remove, self.env, self.folder)
        self._txn: Any = None

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        try:
            with self.env.begin(write=True) as txn:
                self._txn = txn
                yield
        except lmdb.Error as exc:
            raise _failed(exc, self.folder) from exc
        finally:
            self._txn = None

    @contextlib.contextmanager
    def _write(self) -> Iterator[Any]:
        if self._txn is not None:
            yield self._txn
            return
        with self.batch():
            yield self._txn

    def get(self, db: str, key: bytes) -> bytes | None:
        if self._txn is not None:
            got = self._txn.get(key, db=self.db[db])
        else:
            with self.env.begin(db=self.db[db]) as txn:
                got = txn.get(key)
        return None if got is None else bytes(got)

    def put(self, db: str, key: bytes, value: bytes, *, overwrite: bool = True) -> bool:
        with self._write() as txn:
            return bool(txn.put(key, value, db=self.db[db], overwrite=overwrite))

    def delete(self, db: str, key: bytes) -> bool:
        with self._write() as txn:
            return bool(txn.delete(key, db=self.db[db]))

    def items(self, db: str) -> Iterator[tuple[bytes, bytes]]:
        """Every key and value of ``db`` in key order, read in short transactions (a long one would pin
        every page written meanwhile)."""
        after: bytes | None = None
        while True:
            with self.env.begin(db=self.db[db]) as txn:
                cur = txn.cursor()
                if not (cur.set_range(after) if after is not None else cur.first()):
                    return
                chunk = [(bytes(k), bytes(v)) for k, v in itertools.islice(cur.iternext(), _CHUNK + 1)]
            chunk = [kv for kv in chunk if kv[0] != after][:_CHUNK]
            if not chunk:
                return
            yield from chunk
            after = chunk[-1][0]

    def count(self, db: str) -> int:
        with self.env.begin() as txn:
            return int(txn.stat(self.db[db])["entries"])

    def clear(self, db: str) -> None:
        with self._write() as txn:
            txn.drop(self.db[db], delete=False)

    def close(self) -> None:
        self._final()


_Store = _Memory | _Disk


class _Identity:
    """The rules that give each input row its rollouts' ids, checked as rows stream past."""

    def __init__(self) -> None:
        self.distinct = 0

    def _count(self, store: _Store, db: str, key: bytes, default: int) -> int:
        got = store.get(db, key)
        if got is not None:
            return int(_dec.decode(got))
        store.put(db, key, _enc.encode(default))
        return default

    def task(self, store: _Store, row: dict[str, Any], position: int, line: int) -> tuple[int, str]:
        """The row's task index and the base of its rollout ids; a bad or repeated id is a
        ConfigError naming its line (refused, not rewritten: a rewritten id can collide)."""
        if is_nemo_row(row):
            key = hashlib.sha256(json.dumps(row, sort_keys=True).encode()).digest()
            index = self._count(store, "distinct", key, self.distinct)
            if index == self.distinct:
                self.distinct += 1
            task = int(row.get(NG_TASK_INDEX, index))
            return task, str(task)
        base = str(row.get("id", input_digest(row)[:12]))
        if not _TASK_ID.match(base):
            raise ConfigError(f"task id {base!r} on line {line}: use 1-100 of A-Z a-z 0-9 _ -")
        first = self._count(store, "ids", base.encode(), line)
        if first != line:
            raise ConfigError(f"task id {base!r} is on lines {first} and {line}: ids must be unique")
        return position, base

    def repeat(self, store: _Store, base: str) -> int:
        """The next repeat of ``base`` (NeMo Gym numbers a task's rollouts on, across identical rows)."""
        k = self._count(store, "repeats", base.encode(), 0)
        store.put("repeats", base.encode(), _enc.encode(k + 1))
        return k


def _spill(memory: _Memory, near: Path) -> _Disk:
    """The index so far, moved to disk."""
    disk = _Disk(near)
    with disk.batch():
        for name, d in memory.dbs.items():
            for key, value in d.items():
                disk.put(name, key, value)
    memory.close()
    return disk


class Inputs(Mapping[str, RolloutInput]):
    """The collection's rollouts in input order, each with its row: in memory for a small collection,
    on disk (beside ``near``, the output's folder) past :data:`SPILL_AT` rollouts."""

    def __init__(
        self,
        tasks: Iterable[dict[str, Any]],
        num_repeats: int | Callable[[dict[str, Any]], int],
        *,
        lines: Iterable[int] | None = None,
        near: Path,
        spill_at: int | None = None,
    ) -> None:
        spill_at = SPILL_AT if spill_at is None else spill_at
        numbers = iter(lines) if lines is not None else None
        rows, ident = iter(tasks), _Identity()
        store: _Store = _Memory()
        count = position = 0
        try:
            more = True
            while more:  # one write transaction per chunk of rows
                more = False
                with store.batch():
                    for row in rows:
                        line = next(numbers) if numbers is not None else position + 1
                        task, base = ident.task(store, row, position, line)
                        store.put("rows", _POS.pack(position), _enc.encode(row))
                        repeats = num_repeats(row) if callable(num_repeats) else num_repeats
                        for _ in range(repeats):
                            k = ident.repeat(store, base)
                            rid = f"{base}-{k}".encode()
                            store.put("where", rid, _enc.encode((position, task, k)))
                            store.put("order", _POS.pack(count), rid)
                            count += 1
                        position += 1
                        if position % _CHUNK == 0 or (isinstance(store, _Memory) and count > spill_at):
                            more = True
                            break
                if more and isinstance(store, _Memory) and count > spill_at:
                    store = _spill(store, near)
            with store.batch():
                for name in ("distinct", "ids", "repeats"):
                    store.clear(name)
        except BaseException:
            store.close()
            raise
        self._store, self._len = store, count

    @property
    def on_disk(self) -> bool:
        """Whether the index spilled to disk."""
        return isinstance(self._store, _Disk)

    def __getitem__(self, rid: str) -> RolloutInput:
        where = self._store.get("where", rid.encode())
        if where is None:
            raise KeyError(rid)
        position, task, repeat = _where.decode(where)
        row = self._store.get("rows", _POS.pack(position))
        assert row is not None  # written with its rollouts
        return RolloutInput(rid, _dec.decode(row), task, repeat)

    def __contains__(self, rid: object) -> bool:
        return isinstance(rid, str) and self._store.get("where", rid.encode()) is not None

    def __iter__(self) -> Iterator[str]:
        for _, rid in self._store.items("order"):
            yield rid.decode()

    def __len__(self) -> int:
        return self._len

    def written(self) -> Written:
        """The rows written so far, by rollout, in the same store."""
        return Written(self._store)

    def close(self) -> None:
        """Let the index go (a disk index is deleted; also done when it is collected)."""
        self._store.close()


class Written(MutableMapping[str, tuple[str, float]]):
    """Rollout id -> its written row's digest and reward: what an acknowledgement binds."""

    def __init__(self, store: _Store) -> None:
        self._store = store

    def __getitem__(self, rid: str) -> tuple[str, float]:
        got = self._store.get("written", rid.encode())
        if got is None:
            raise KeyError(rid)
        return _kept.decode(got)

    def __setitem__(self, rid: str, kept: tuple[str, float]) -> None:
        self._store.put("written", rid.encode(), _enc.encode(kept))

    def __delitem__(self, rid: str) -> None:
        if not self._store.delete("written", rid.encode()):
            raise KeyError(rid)

    def __iter__(self) -> Iterator[str]:
        return (rid.decode() for rid, _ in self._store.items("written"))

    def __len__(self) -> int:
        return self._store.count("written")

    def __contains__(self, rid: object) -> bool:
        return isinstance(rid, str) and self._store.get("written", rid.encode()) is not None

    def add(self, rid: str, kept: tuple[str, float]) -> bool:
        """Keep ``kept`` for ``rid`` unless it has a row already; whether it was new."""
        return self._store.put("written", rid.encode(), _enc.encode(kept), overwrite=False)

    def clear(self) -> None:
        self._store.clear("written")
