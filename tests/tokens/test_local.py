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


async def test_a_blocking_store_is_called_off_the_event_loop(tmp_path: Path) -> None:
    import threading

    from rollcut.tokens import call_store

    seen: list[int] = []

    class Remote(LocalTokenStore):
        blocking = True  # as a store behind a network would declare

        def chain(self, call_id: str) -> list[str]:
            seen.append(threading.get_ident())
            return super().chain(call_id)

    with Remote(tmp_path / "remote") as remote, LocalTokenStore(tmp_path / "local") as local:
        remote.link("c1", None, "r1")
        assert await call_store(remote, remote.chain, "c1") == ["c1"]
        assert seen and seen[0] != threading.get_ident()
        local.link("c1", None, "r1")
        assert await call_store(local, local.chain, "c1") == ["c1"]  # a local store answers inline
