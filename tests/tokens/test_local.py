"""The local LMDB token store against the contract, plus what only it can break."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollcut import TokenStoreError
from rollcut.tokens import LocalTokenStore

from .contract import TokenStoreContract, record


class TestLocalTokenStore(TokenStoreContract):
    def make_store(self, tmp_path: Path) -> LocalTokenStore:
        return LocalTokenStore(tmp_path / "tokens")


def test_corrupted_record_on_disk_fails_snapshot_verification(tmp_path: Path) -> None:
    store = LocalTokenStore(tmp_path / "tokens")
    r = store.put("c1", record(3))
    snap = store.snapshot("ck")
    with store.env.begin(write=True) as txn:  # flip bytes of the stored record, as bit rot would
        v = bytearray(txn.get(r.receipt_id.encode(), db=store._records))
        v[-2] ^= 0xFF
        txn.put(r.receipt_id.encode(), bytes(v), db=store._records)
    problems = store.verify_snapshot(snap)
    assert problems and r.receipt_id in problems[0]
    with pytest.raises(TokenStoreError, match=r.receipt_id):
        store.get(r)
    store.close()
