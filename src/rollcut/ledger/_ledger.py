"""The LMDB ledger: checkpoint catalog and per-rollout index.

It is an index and a catalog, never the source of truth: everything in it can
be rebuilt from the stream. That is why opening a corrupted or newer-schema
ledger fails loudly instead of "repairing" it in place: the operator keeps the
evidence, and ``rollcut ledger rebuild`` writes a fresh one beside it.

Named databases:

    meta             schema_version, stream, watermark (last projected seq)
    checkpoints      checkpoint_id -> CheckpointRecord
    checkpoint_cuts  cut (8-byte big-endian) + checkpoint_id -> b""   (ordered: latest is last)
    rollouts         rollout_id -> RolloutIndex
    calls            rollout \0 attempt \0 call_id -> b"c" completed | b"p" prefix cut
    revisions        rollout \0 attempt \0 session -> highest revision (8-byte big-endian)

The last two exist so a checkpoint can check that an agent boundary's
references (its last model call, its resources revisions) resolve below the
cut without rereading the log.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self, TypeVar

import lmdb
import msgspec

from .._errors import LedgerCorruptError, LedgerError, LedgerSchemaError
from .._files import PRIVATE_FILE, private_dir
from .._lmdb import LmdbFile, lmdb_problem, storage_error
from ._records import LEDGER_SCHEMA_VERSION, CheckpointRecord, RolloutIndex

__all__ = ["Ledger"]

T = TypeVar("T")
_DBS = ("meta", "checkpoints", "checkpoint_cuts", "rollouts", "calls", "revisions", "accepted")
# rollouts by the sequence of their acceptance (issue 33): compaction reads the range it frees, not
# every rollout the namespace ever had
_ACCEPTED_INDEXED = "accepted_index"
_enc = msgspec.msgpack.Encoder()


def _cut_key(cut: int, checkpoint_id: str) -> bytes:
    return struct.pack(">Q", cut) + checkpoint_id.encode()


def session_key(rollout_id: str, attempt: int, name: str) -> bytes:
    return f"{rollout_id}\0{attempt}\0{name}".encode()


class Ledger(LmdbFile):
    """One LMDB environment (a directory) per coordinator."""

    def __init__(
        self, path: str | os.PathLike[str], *, map_size: int = 1 << 30, readonly: bool = False
    ) -> None:
        self.path = Path(path)
        self.readonly = readonly
        if readonly and not (self.path / "data.mdb").exists():
            raise LedgerError(f"no ledger at {self.path}", path=str(self.path))
        if not readonly:
            private_dir(self.path)  # an index of every rollout: owner only
        problem = lmdb_problem(self.path / "data.mdb")
        if problem is not None:
            raise LedgerCorruptError(
                f"{problem}; it was left untouched. Rebuild it from the stream with `rollcut ledger rebuild`",
                path=str(self.path),
            )
        try:
            self.env = lmdb.open(
                str(self.path),
                mode=PRIVATE_FILE,
                map_size=map_size,
                max_dbs=len(_DBS),
                subdir=True,
                readonly=readonly,
                metasync=True,
                sync=True,
            )
            self._db = {}
            for name in _DBS:
                try:
                    self._db[name] = self.env.open_db(name.encode(), create=not readonly)
                except lmdb.NotFoundError:
                    if name != "accepted":  # a ledger from before the index, read only: scanned instead
                        raise
        except lmdb.Error as exc:
            raise LedgerCorruptError(
                f"cannot open the ledger at {self.path}: {exc}; it was left untouched. "
                "Rebuild it from the stream with `rollcut ledger rebuild`",
                path=str(self.path),
            ) from exc
        self._check_schema()
        if not readonly:
            self._index_accepted()

    def _index_accepted(self) -> None:
        """Index a ledger written before the accepted index existed, once."""
        with self.env.begin(write=True) as txn:
            if txn.get(_ACCEPTED_INDEXED.encode(), db=self._db["meta"]) is not None:
                return
            for k, v in txn.cursor(db=self._db["rollouts"]):
                rec = self._decode(v, RolloutIndex, "rollouts", k)
                if rec.accepted_seq is not None:
                    txn.put(_cut_key(rec.accepted_seq, rec.rollout_id), b"", db=self._db["accepted"])
            txn.put(_ACCEPTED_INDEXED.encode(), _enc.encode(True), db=self._db["meta"])

    def _check_schema(self) -> None:
        with self.env.begin(db=self._db["meta"], write=not self.readonly) as txn:
            raw = txn.get(b"schema_version")
            if raw is None:
                if txn.stat(self._db["rollouts"])["entries"] or txn.stat(self._db["checkpoints"])["entries"]:
                    raise LedgerCorruptError(
                        f"ledger at {self.path} has data but no schema_version", path=str(self.path)
                    )
                if not self.readonly:
                    txn.put(b"schema_version", _enc.encode(LEDGER_SCHEMA_VERSION))
                return
            version = self._decode(raw, int, "meta", b"schema_version")
            if version > LEDGER_SCHEMA_VERSION:
                raise LedgerSchemaError(
                    f"ledger at {self.path} has schema_version {version}, newer than the "
                    f"{LEDGER_SCHEMA_VERSION} this rollcut supports; it was left untouched",
                    path=str(self.path),
                )

    # --- decoding ---------------------------------------------------------------

    def _decode(self, raw: bytes, typ: type[T], db: str, key: bytes) -> T:
        try:
            return msgspec.msgpack.decode(raw, type=typ)
        except msgspec.DecodeError as exc:
            raise LedgerCorruptError(
                f"ledger {self.path}: {db}[{key!r}] does not decode as {typ.__name__}: {exc}",
                path=str(self.path),
            ) from exc

    # --- meta -------------------------------------------------------------------

    def meta(self, key: str, default: Any = None) -> Any:
        with self.env.begin(db=self._db["meta"]) as txn:
            raw = txn.get(key.encode())
        return default if raw is None else msgspec.msgpack.decode(raw)

    @property
    def watermark(self) -> int:
        return int(self.meta("watermark", 0))

    # --- reads ------------------------------------------------------------------

    def rollout(self, rollout_id: str) -> RolloutIndex | None:
        with self.env.begin(db=self._db["rollouts"]) as txn:
            raw = txn.get(rollout_id.encode())
        return None if raw is None else self._decode(raw, RolloutIndex, "rollouts", rollout_id.encode())

    def rollouts(self) -> Iterator[RolloutIndex]:
        with self.env.begin(db=self._db["rollouts"]) as txn:
            for k, v in txn.cursor():
                yield self._decode(v, RolloutIndex, "rollouts", k)

    def accepted_between(self, after: int, up_to: int) -> list[str]:
        """The rollouts whose acceptance lies in ``(after, up_to]``, in log order."""
        db = self._db.get("accepted")
        if db is None:  # a read-only ledger from before the index
            return [
                r.rollout_id
                for r in self.rollouts()
                if r.accepted_seq is not None and after < r.accepted_seq <= up_to
            ]
        out = []
        with self.env.begin(db=db) as txn:
            cur = txn.cursor()
            if cur.set_range(struct.pack(">Q", after + 1)):
                for key in cur.iternext(values=False):
                    if struct.unpack(">Q", key[:8])[0] > up_to:
                        break
                    out.append(bytes(key[8:]).decode())
        return out

    def call_ids(self, rollout_id: str) -> list[str]:
        """Every model call of the rollout's attempts whose tokens are in custody (it named a receipt)."""
        prefix = f"{rollout_id}\0".encode()
        with self.env.begin(db=self._db["calls"]) as txn:
            cur = txn.cursor()
            out = []
            if cur.set_range(prefix):
                for key in cur.iternext(values=False):
                    if not bytes(key).startswith(prefix):
                        break
                    out.append(bytes(key).rsplit(b"\0", 1)[1].decode())
        return out

    def checkpoint(self, checkpoint_id: str) -> CheckpointRecord | None:
        with self.env.begin(db=self._db["checkpoints"]) as txn:
            raw = txn.get(checkpoint_id.encode())
        return (
            None
            if raw is None
            else self._decode(raw, CheckpointRecord, "checkpoints", checkpoint_id.encode())
        )

    def checkpoints(self) -> list[CheckpointRecord]:
        """Every published checkpoint, oldest cut first."""
        out = []
        with self.env.begin() as txn:
            for k, _ in txn.cursor(db=self._db["checkpoint_cuts"]):
                cid = k[8:]
                raw = txn.get(cid, db=self._db["checkpoints"])
                if raw is None:
                    raise LedgerCorruptError(
                        f"ledger {self.path}: cut index names missing checkpoint {cid!r}", path=str(self.path)
                    )
                out.append(self._decode(raw, CheckpointRecord, "checkpoints", cid))
        return out

    def latest_checkpoint(self) -> CheckpointRecord | None:
        with self.env.begin() as txn:
            cur = txn.cursor(db=self._db["checkpoint_cuts"])
            if not cur.last():
                return None
            cid = cur.key()[8:]
            raw = txn.get(cid, db=self._db["checkpoints"])
        return None if raw is None else self._decode(raw, CheckpointRecord, "checkpoints", cid)

    def call_status(self, rollout_id: str, attempt: int, call_id: str) -> str | None:
        """ "completed", "prefix_cut", or None if no such call ended below the watermark."""
        with self.env.begin(db=self._db["calls"]) as txn:
            raw = txn.get(session_key(rollout_id, attempt, call_id))
        return None if raw is None else {b"c": "completed", b"p": "prefix_cut"}[bytes(raw)]

    def revision(self, rollout_id: str, attempt: int, session: str) -> int:
        with self.env.begin(db=self._db["revisions"]) as txn:
            raw = txn.get(session_key(rollout_id, attempt, session))
        return 0 if raw is None else struct.unpack(">Q", raw)[0]

    def dump(self) -> dict[str, dict[bytes, bytes]]:
        """Every key and value of every named database (for equality checks)."""
        out: dict[str, dict[bytes, bytes]] = {}
        with self.env.begin() as txn:
            for name, db in self._db.items():
                out[name] = {bytes(k): bytes(v) for k, v in txn.cursor(db=db)}
        return out

    # --- writes -----------------------------------------------------------------

    def write(self) -> _WriteBatch:
        """One LMDB write transaction; commit is all-or-nothing."""
        if self.readonly:
            raise LedgerError(f"ledger at {self.path} was opened read-only", path=str(self.path))
        return _WriteBatch(self)


class _WriteBatch:
    """Write access inside one transaction, with a small read-through cache."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._txn: lmdb.Transaction | None = None
        self._rollouts: dict[str, RolloutIndex] = {}

    def __enter__(self) -> Self:
        try:
            self._txn = self.ledger.env.begin(write=True)
        except lmdb.Error as exc:
            raise storage_error(exc, self.ledger.path, "write the ledger") or LedgerError(
                f"cannot write the ledger at {self.ledger.path}: {exc}", path=str(self.ledger.path)
            ) from exc
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        txn, self._txn = self._txn, None
        assert txn is not None
        if exc_type is not None:
            txn.abort()
            return
        db, accepted = self.ledger._db["rollouts"], self.ledger._db["accepted"]
        for rid, rec in self._rollouts.items():
            txn.put(rid.encode(), _enc.encode(rec), db=db)
            if rec.accepted_seq is not None:
                txn.put(_cut_key(rec.accepted_seq, rid), b"", db=accepted)
        try:
            txn.commit()
        except lmdb.Error as exc:
            raise storage_error(exc, self.ledger.path, "commit the ledger") or LedgerError(
                f"ledger commit failed at {self.ledger.path}: {exc}", path=str(self.ledger.path)
            ) from exc

    @property
    def txn(self) -> lmdb.Transaction:
        if self._txn is None:
            raise LedgerError("write batch used outside its with-block", path=str(self.ledger.path))
        return self._txn

    def rollout(self, rollout_id: str) -> RolloutIndex | None:
        rec = self._rollouts.get(rollout_id)
        if rec is None:
            raw = self.txn.get(rollout_id.encode(), db=self.ledger._db["rollouts"])
            if raw is None:
                return None
            rec = self.ledger._decode(bytes(raw), RolloutIndex, "rollouts", rollout_id.encode())
            self._rollouts[rollout_id] = rec
        return rec

    def put_rollout(self, rec: RolloutIndex) -> None:
        self._rollouts[rec.rollout_id] = rec

    def put_checkpoint(self, rec: CheckpointRecord) -> None:
        """Publish a checkpoint record (idempotent for identical content)."""
        key = rec.checkpoint_id.encode()
        existing = self.txn.get(key, db=self.ledger._db["checkpoints"])
        if existing is not None:
            old = self.ledger._decode(bytes(existing), CheckpointRecord, "checkpoints", key)
            if (old.cut, old.token_snapshot_digest) != (rec.cut, rec.token_snapshot_digest):
                raise LedgerError(
                    f"checkpoint {rec.checkpoint_id} is already published with cut {old.cut}; "
                    f"refusing to overwrite it with cut {rec.cut}",
                    path=str(self.ledger.path),
                    checkpoint_id=rec.checkpoint_id,
                )
            return
        self.txn.put(key, _enc.encode(rec), db=self.ledger._db["checkpoints"])
        self.txn.put(_cut_key(rec.cut, rec.checkpoint_id), b"", db=self.ledger._db["checkpoint_cuts"])

    def drop_checkpoint(self, rec: CheckpointRecord) -> None:
        """Take a checkpoint out of the catalog (compaction dropped its markers from the stream)."""
        self.txn.delete(rec.checkpoint_id.encode(), db=self.ledger._db["checkpoints"])
        self.txn.delete(_cut_key(rec.cut, rec.checkpoint_id), db=self.ledger._db["checkpoint_cuts"])

    def forget_sessions(self, rollout_id: str) -> None:
        """Drop a rollout's call outcomes and resources revisions (its events were compacted away)."""
        prefix = f"{rollout_id}\0".encode()
        for name in ("calls", "revisions"):
            cur = self.txn.cursor(db=self.ledger._db[name])
            if cur.set_range(prefix):
                while bytes(cur.key()).startswith(prefix):
                    if not cur.delete():
                        break

    def set_call(self, rollout_id: str, attempt: int, call_id: str, status: bytes) -> None:
        """Record a call's outcome; a completion is final, so a prefix cut never replaces one. (A cut
        taken while the call was finishing can land on the log after its completion.)"""
        key, db = session_key(rollout_id, attempt, call_id), self.ledger._db["calls"]
        if status == b"p" and self.txn.get(key, db=db) == b"c":
            return
        self.txn.put(key, status, db=db)

    def raise_revision(self, rollout_id: str, attempt: int, session: str, revision: int) -> None:
        key, db = session_key(rollout_id, attempt, session), self.ledger._db["revisions"]
        raw = self.txn.get(key, db=db)
        if raw is None or struct.unpack(">Q", raw)[0] < revision:
            self.txn.put(key, struct.pack(">Q", revision), db=db)

    def set_meta(self, key: str, value: Any) -> None:
        self.txn.put(key.encode(), _enc.encode(value), db=self.ledger._db["meta"])

    def meta(self, key: str, default: Any = None) -> Any:
        """A meta value as this transaction sees it (another process may have moved it)."""
        raw = self.txn.get(key.encode(), db=self.ledger._db["meta"])
        return default if raw is None else msgspec.msgpack.decode(raw)
