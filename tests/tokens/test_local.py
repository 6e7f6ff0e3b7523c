"""The local LMDB token store against the contract, plus what only it can break."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rollcut import TokenStoreError
from rollcut.testing import TokenStoreContract
from rollcut.testing import sample_record as record
from rollcut.tokens import LocalTokenStore


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


def test_a_truncated_store_is_an_error_not_a_crash(tmp_path: Path) -> None:
    """Mapping a truncated LMDB file kills the process with SIGBUS; the store refuses it first.

    Run in a child process so that a regression shows as the signal it would be in production.
    """
    store = LocalTokenStore(tmp_path / "tokens")
    for i in range(40):
        store.put(f"c{i}", record(200))
    store.close()
    data = tmp_path / "tokens" / "data.mdb"
    whole = data.read_bytes()
    data.write_bytes(whole[: len(whole) // 2])
    code = (
        "import sys\nfrom rollcut import TokenStoreError\nfrom rollcut.tokens import LocalTokenStore\n"
        "try:\n    LocalTokenStore(sys.argv[1])\nexcept TokenStoreError as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "tokens")], capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 3, child.stderr
    assert "truncated" in child.stdout and len(whole) // 2 == data.stat().st_size  # left untouched
