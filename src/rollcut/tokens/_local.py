"""The default token store: one LMDB environment on local disk.

Snapshots must be cheap to take inside a checkpoint, whatever the number of
records, so the store keeps an order-independent multiset hash (the sum of
blake2b-256 of every ``receipt_id:digest``, mod 2**256) updated on each put.
A snapshot is then ``(count, hash)`` read in one transaction; verifying it
recomputes the hash from the records themselves, checking each record's
content against its digest on the way.

Named databases: ``records`` (receipt id -> index, digest, zstd msgpack body),
``lineage`` (call id -> parent call id, receipt id), ``snapshots``
(snapshot id -> TokenSnapshot), ``meta`` (count, hash; released count and
hash), ``released`` (receipt id -> index, digest, msgpack :class:`Released`),
``rebates`` (snapshot id -> the count and hash of the records released below
it).

Releasing (compaction, :meth:`LocalTokenStore.release`) deletes a record and
keeps its :class:`Released` (tens of bytes). The store's count and hash still
cover every record ever put (indexes never repeat), so a snapshot taken after
a release binds the same kind of identity as before; each snapshot kept
remembers the terms of the records released below its count (its rebate, set
when it is taken and added to on every release), and verification adds it to
what it recomputes from the records left.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence
from pathlib import Path

import lmdb
import msgspec
import zstandard

from .._errors import TokenStoreError
from .._files import PRIVATE_FILE, private_dir
from .._lmdb import LmdbFile, lmdb_problem, storage_error
from ..bus import TokenReceipt, digest
from ._contracts import Released, ReleaseReport, TokenRecord, TokenSnapshot, arrays_digest

__all__ = ["LocalTokenStore"]

_MOD = 1 << 256
_enc = msgspec.msgpack.Encoder()
_rec_dec = msgspec.msgpack.Decoder(TokenRecord)
_snap_dec = msgspec.msgpack.Decoder(TokenSnapshot)
_released_dec = msgspec.msgpack.Decoder(Released)


def _term(receipt_id: str, dig: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{receipt_id}:{dig}".encode(), digest_size=32).digest(), "big")


class LocalTokenStore(LmdbFile):
    """TokenSink, TokenSource and LineageStore over one LMDB directory."""

    blocking = False  # a local LMDB write: microseconds, called inline

    def __init__(self, path: str | os.PathLike[str], *, map_size: int = 1 << 32, name: str = "local") -> None:
        self.path = Path(path)
        self.name = name
        private_dir(self.path)  # every prompt and output: owner only
        problem = lmdb_problem(self.path / "data.mdb")
        if problem is not None:
            raise TokenStoreError(
                f"{problem}; it was left untouched: restore the token store from a copy", store=str(self.path)
            )
        try:
            self.env = lmdb.open(str(self.path), map_size=map_size, max_dbs=8, sync=True, mode=PRIVATE_FILE)
        except lmdb.Error as exc:
            raise TokenStoreError(
                f"cannot open token store at {self.path}: {exc}", store=str(self.path)
            ) from exc
        self._records = self.env.open_db(b"records")
        self._lineage = self.env.open_db(b"lineage")
        self._snapshots = self.env.open_db(b"snapshots")
        self._meta = self.env.open_db(b"meta")
        self._released = self.env.open_db(b"released")
        self._rebates = self.env.open_db(b"rebates")
        self._zc = zstandard.ZstdCompressor(level=3)
        self._zd = zstandard.ZstdDecompressor()

    # --- sink ---------------------------------------------------------------------

    def put(self, call_id: str, record: TokenRecord) -> TokenReceipt:
        prepared = self.prepare(call_id, record)
        self.write_many([prepared], [])
        return prepared[0]

    def prepare(self, call_id: str, record: TokenRecord) -> tuple[TokenReceipt, bytes]:
        """The receipt of a record and its stored form (digest, zstd body): everything but the write,
        so a batch of writes can be committed elsewhere (another thread) in one transaction."""
        body = _enc.encode(record)
        dig = digest(body)
        receipt = TokenReceipt(
            receipt_id=f"{call_id}-{dig[:12]}", count=len(record.output_ids), digest=dig, store=self.name
        )
        return receipt, bytes.fromhex(dig) + self._zc.compress(body)

    def write_many(
        self, puts: list[tuple[TokenReceipt, bytes]], links: list[tuple[str, str | None, str]]
    ) -> None:
        """Prepared records and lineage links, durable together: one transaction, one fsync. Thread
        safe against the store's readers (LMDB: one writer, readers never blocked)."""
        try:
            with self.env.begin(write=True) as txn:
                count, acc = self._counters(txn)
                for receipt, packed in puts:
                    key = receipt.receipt_id.encode()
                    if txn.get(key, db=self._records) is not None:
                        continue  # idempotent: same call, same content
                    txn.put(key, struct.pack(">Q", count) + packed, db=self._records)
                    count += 1
                    acc = (acc + _term(receipt.receipt_id, receipt.digest)) % _MOD
                txn.put(b"count", struct.pack(">Q", count), db=self._meta)
                txn.put(b"hash", acc.to_bytes(32, "big"), db=self._meta)
                for call_id, parent, receipt_id in links:
                    txn.put(call_id.encode(), _enc.encode((parent, receipt_id)), db=self._lineage)
        except lmdb.Error as exc:  # a full disk is a StorageError (the call is answered 503, retryable)
            what = puts[0][0].receipt_id if puts else links[0][0] if links else "nothing"
            raise storage_error(exc, self.path, f"store the tokens of {what}") or TokenStoreError(
                f"cannot store the tokens of {what} at {self.path}: {exc}",
                store=str(self.path),
                call_id=what,
            ) from exc

    def _counters(self, txn: lmdb.Transaction, prefix: bytes = b"") -> tuple[int, int]:
        c = txn.get(prefix + b"count", db=self._meta)
        h = txn.get(prefix + b"hash", db=self._meta)
        return (struct.unpack(">Q", c)[0] if c else 0), (int.from_bytes(h, "big") if h else 0)

    # --- source -------------------------------------------------------------------

    def _raw(self, receipt_id: str) -> tuple[int, str, bytes] | None:
        with self.env.begin() as txn:
            v = txn.get(receipt_id.encode(), db=self._records)
        if v is None:
            return None
        return struct.unpack(">Q", v[:8])[0], v[8:24].hex(), bytes(v[24:])

    def has(self, receipt: TokenReceipt) -> bool:
        raw = self._raw(receipt.receipt_id)
        return raw is not None and raw[1] == receipt.digest[:32]

    def get(self, receipt: TokenReceipt) -> TokenRecord:
        raw = self._raw(receipt.receipt_id)
        if raw is None:
            raise TokenStoreError(
                f"token store {self.path}: no record for receipt {receipt.receipt_id}",
                store=str(self.path),
                receipt_id=receipt.receipt_id,
            )
        _, dig, packed = raw
        try:
            body = self._zd.decompress(packed)
        except zstandard.ZstdError as exc:
            raise TokenStoreError(
                f"receipt {receipt.receipt_id}: stored record is corrupt: {exc}",
                store=str(self.path),
                receipt_id=receipt.receipt_id,
            ) from exc
        if digest(body) != receipt.digest or dig != receipt.digest[:32]:
            raise TokenStoreError(
                f"receipt {receipt.receipt_id}: stored record does not match its digest",
                store=str(self.path),
                receipt_id=receipt.receipt_id,
            )
        return _rec_dec.decode(body)

    # --- lineage ------------------------------------------------------------------

    def link(self, call_id: str, parent_call_id: str | None, receipt_id: str) -> None:
        self.write_many([], [(call_id, parent_call_id, receipt_id)])

    def chain(self, call_id: str) -> list[str]:
        out: list[str] = []
        seen: set[str] = set()
        cur: str | None = call_id
        with self.env.begin() as txn:
            while cur is not None and cur not in seen:
                seen.add(cur)
                raw = txn.get(cur.encode(), db=self._lineage)
                if raw is None:
                    raise TokenStoreError(
                        f"lineage of {call_id}: no link for {cur}", store=str(self.path), call_id=cur
                    )
                out.append(cur)
                cur = msgspec.msgpack.decode(raw)[0]
        return out[::-1]

    # --- snapshots ----------------------------------------------------------------

    def snapshot(self, checkpoint_id: str) -> TokenSnapshot:
        sid = f"snap-{checkpoint_id}"
        with self.env.begin(write=True) as txn:
            existing = txn.get(sid.encode(), db=self._snapshots)
            if existing is not None:
                return _snap_dec.decode(existing)
            count, acc = self._counters(txn)
            txn.put(sid.encode(), _rebate(*self._counters(txn, b"released_")), db=self._rebates)
            snap = TokenSnapshot(
                snapshot_id=sid,
                checkpoint_id=checkpoint_id,
                count=count,
                digest=acc.to_bytes(32, "big").hex(),
                store=self.name,
            )
            txn.put(sid.encode(), _enc.encode(snap), db=self._snapshots)
        return snap

    def find_snapshot(self, snapshot_id: str) -> TokenSnapshot | None:
        with self.env.begin() as txn:
            raw = txn.get(snapshot_id.encode(), db=self._snapshots)
        return None if raw is None else _snap_dec.decode(raw)

    def in_snapshot(self, snapshot: TokenSnapshot, receipt: TokenReceipt) -> bool:
        raw = self._raw(receipt.receipt_id)
        return raw is not None and raw[0] < snapshot.count and raw[1] == receipt.digest[:32]

    def verify_snapshot(self, snapshot: TokenSnapshot) -> list[str]:
        problems: list[str] = []
        with self.env.begin() as txn:
            stored = txn.get(snapshot.snapshot_id.encode(), db=self._snapshots)
            if stored is None or _snap_dec.decode(stored) != snapshot:
                problems.append(f"snapshot {snapshot.snapshot_id} is not recorded as bound")
            acc = 0
            for key, value in txn.cursor(db=self._records):
                index = struct.unpack(">Q", value[:8])[0]
                if index >= snapshot.count:
                    continue
                rid, dig = bytes(key).decode(), value[8:24].hex()
                try:
                    body = self._zd.decompress(bytes(value[24:]))
                except zstandard.ZstdError:
                    problems.append(f"receipt {rid}: record does not decompress")
                    continue
                full = digest(body)
                if full[:32] != dig:
                    problems.append(f"receipt {rid}: record does not match its digest")
                acc = (acc + _term(rid, full)) % _MOD
            rebate = txn.get(snapshot.snapshot_id.encode(), db=self._rebates)
            if rebate is not None:  # the records released below this snapshot, as it remembers them
                acc = (acc + int.from_bytes(rebate[8:], "big")) % _MOD
        if acc.to_bytes(32, "big").hex() != snapshot.digest:
            problems.append(f"snapshot {snapshot.snapshot_id}: recomputed digest differs")
        return problems

    # --- release (compaction) -------------------------------------------------------

    def release(self, call_ids: Sequence[str], forget_snapshots: Sequence[str] = ()) -> ReleaseReport:
        """Let go of every record of ``call_ids`` and their links, keeping a :class:`Released` each,
        and forget ``forget_snapshots``; one transaction. Idempotent: a call released before, or
        never stored here, is skipped."""
        out = ReleaseReport()
        try:
            with self.env.begin(write=True) as txn:
                for sid in forget_snapshots:
                    gone = txn.delete(sid.encode(), db=self._snapshots)
                    txn.delete(sid.encode(), db=self._rebates)
                    out.snapshots_forgotten += int(gone)
                kept = [
                    (bytes(k), _snap_dec.decode(v).count)
                    for k, v in txn.cursor(db=self._snapshots)  # the kept checkpoints': a handful
                ]
                rebates = {k: _unrebate(txn.get(k, db=self._rebates)) for k, _ in kept}
                n_rel, acc_rel = self._counters(txn, b"released_")
                for call_id in call_ids:
                    for key, value in self._records_of(txn, call_id):
                        index, dig = struct.unpack(">Q", value[:8])[0], value[8:24].hex()
                        record = _rec_dec.decode(self._zd.decompress(value[24:]))
                        kept_of = Released(
                            arrays_digest=arrays_digest(
                                record.prompt_ids, record.output_ids, record.logprobs
                            ),
                            segments=record.spans(),
                        )
                        txn.put(key, value[:24] + _enc.encode(kept_of), db=self._released)
                        txn.delete(key, db=self._records)
                        term = _term(key.decode(), dig)
                        n_rel, acc_rel = n_rel + 1, (acc_rel + term) % _MOD
                        for skey, count in kept:
                            if index < count:
                                n, acc = rebates[skey]
                                rebates[skey] = (n + 1, (acc + term) % _MOD)
                        out.records_released += 1
                        out.bytes_released += len(value)
                    txn.delete(call_id.encode(), db=self._lineage)
                for skey, (n, acc) in rebates.items():
                    txn.put(skey, _rebate(n, acc), db=self._rebates)
                txn.put(b"released_count", struct.pack(">Q", n_rel), db=self._meta)
                txn.put(b"released_hash", acc_rel.to_bytes(32, "big"), db=self._meta)
        except (lmdb.Error, zstandard.ZstdError, msgspec.DecodeError) as exc:
            what = call_ids[0] if call_ids else "nothing"
            raise storage_error(exc, self.path, f"release the tokens of {what}") or TokenStoreError(
                f"cannot release the tokens of {what} at {self.path}: {exc}", store=str(self.path)
            ) from exc
        return out

    def _records_of(self, txn: lmdb.Transaction, call_id: str) -> list[tuple[bytes, bytes]]:
        """A call's records (its receipt ids are ``<call id>-<digest prefix>``; call ids have one
        length, so the prefix is the call's alone)."""
        prefix = f"{call_id}-".encode()
        cur = txn.cursor(db=self._records)
        out: list[tuple[bytes, bytes]] = []
        if cur.set_range(prefix):
            for key, value in cur:
                if not bytes(key).startswith(prefix):
                    break
                out.append((bytes(key), bytes(value)))
        return out

    def released(self, receipt: TokenReceipt) -> Released | None:
        with self.env.begin() as txn:
            raw = txn.get(receipt.receipt_id.encode(), db=self._released)
        if raw is None or bytes(raw[8:24]).hex() != receipt.digest[:32]:
            return None
        return _released_dec.decode(bytes(raw[24:]))

    def used_bytes(self) -> int:
        """The pages the store's databases use now (LMDB reuses freed pages; the file's size is its
        high-water mark)."""
        with self.env.begin() as txn:
            stats = [self.env.stat()] + [
                txn.stat(db)
                for db in (
                    self._records,
                    self._lineage,
                    self._snapshots,
                    self._meta,
                    self._released,
                    self._rebates,
                )
            ]
        return sum(
            (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * st["psize"] for st in stats
        )


def _rebate(count: int, acc: int) -> bytes:
    return struct.pack(">Q", count) + acc.to_bytes(32, "big")


def _unrebate(raw: bytes | None) -> tuple[int, int]:
    if raw is None:  # a snapshot taken before releases existed: nothing was released below it
        return 0, 0
    return struct.unpack(">Q", raw[:8])[0], int.from_bytes(raw[8:], "big")
