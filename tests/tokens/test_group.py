"""Group commit of token-store writes: concurrent calls share a transaction, each waits for its own."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from rollcut import RollcutError
from rollcut.testing import sample_record as record
from rollcut.tokens import LocalTokenStore, TokenRecord, TokenWrites


async def test_concurrent_writes_share_transactions_and_each_is_durable_when_awaited(tmp_path: Path) -> None:
    store = LocalTokenStore(tmp_path / "tokens")
    writes = TokenWrites(store)

    async def call(i: int) -> tuple[str, str]:
        rec = record(i % 7 + 1)
        receipt = await writes.put(f"c{i}", rec, parent=f"c{i - 1}" if i else None, link=True)
        # awaited: durable, readable, and linked
        assert store.get(receipt) == rec and store.has(receipt)
        return f"c{i}", receipt.receipt_id

    done = await asyncio.gather(*(call(i) for i in range(64)))
    assert writes.writes == 128 and writes.flushes < 64  # records and links, in fewer transactions
    assert store.chain("c63") == [f"c{i}" for i in range(64)]
    snap = store.snapshot("ck")
    assert snap.count == 64 and store.verify_snapshot(snap) == []
    # the same call and content again is idempotent, grouped or not
    again = await writes.put("c0", record(1))
    assert again.receipt_id == done[0][1] and store.snapshot("ck2").count == 64
    store.close()
    reopened = LocalTokenStore(tmp_path / "tokens")  # durable: another process would see them all
    assert reopened.snapshot("ck3").count == 64
    reopened.close()


async def test_a_failed_transaction_fails_every_write_in_it_and_stores_none(tmp_path: Path) -> None:
    store = LocalTokenStore(tmp_path / "tokens", map_size=256 * 1024)  # a disk that fills up
    writes = TokenWrites(store)
    rng = random.Random(0)  # incompressible: the store's zstd cannot make room
    big = TokenRecord(prompt_ids=[rng.getrandbits(31) for _ in range(20_000)], output_ids=[])
    before = store.snapshot("before").count
    results = await asyncio.gather(
        *(
            writes.put(f"c{i}", TokenRecord(prompt_ids=big.prompt_ids, output_ids=[i, *big.output_ids]))
            for i in range(8)
        ),
        return_exceptions=True,
    )
    failed = [r for r in results if isinstance(r, BaseException)]
    assert failed and all(isinstance(r, RollcutError) for r in failed)
    stored = [r for r in results if not isinstance(r, BaseException)]
    assert store.snapshot("after").count == before + len(stored)
    for r in stored:  # what was acknowledged is there; nothing else is
        assert store.has(r)
    small = await writes.put("c-small", record(2))  # the writer is not wedged by a failed batch
    assert store.has(small) and store.snapshot("later").count == before + len(stored) + 1
    store.close()
