"""Releasing token records (compaction): what goes, what is kept of it, and that every snapshot kept
still verifies, while the checks that catch a damaged store keep catching it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollcut import TokenStoreError
from rollcut.bus import TokenReceipt
from rollcut.testing import sample_record as record
from rollcut.tokens import LocalTokenStore, Releasable, TokenRecord, VersionSegment, arrays_digest


def _big(n: int, seed: int) -> TokenRecord:
    """A record of ``n`` output tokens that zstd cannot shrink much (ids spread over the vocabulary)."""
    ids = [(seed * 7919 + i * 104729) % 262_144 for i in range(n)]
    return TokenRecord(
        prompt_ids=ids[: n // 2],
        output_ids=ids,
        logprobs=[-((i * seed) % 97) / 31 for i in range(n)],
        segments=[
            VersionSegment(version=3, start=0, end=n // 3),
            VersionSegment(version=4, start=n // 3, end=n),
        ],
    )


@pytest.fixture
def store(tmp_path: Path) -> LocalTokenStore:
    with LocalTokenStore(tmp_path / "tokens") as s:
        yield s


def _call(i: int) -> str:
    return f"c{i:020x}"  # a model call id's shape: one length for all


def test_released_records_go_the_rest_stay_and_every_kept_snapshot_still_verifies(
    store: LocalTokenStore,
) -> None:
    assert isinstance(store, Releasable)
    a, b = store.put(_call(1), _big(300, 1)), store.put(_call(2), record(4))
    store.link(_call(1), None, a.receipt_id)
    first = store.snapshot("ck-1")
    c = store.put(_call(3), _big(300, 3))
    second = store.snapshot("ck-2")

    out = store.release([_call(1), _call(3)])
    assert (out.records_released, out.snapshots_forgotten) == (2, 0) and out.bytes_released > 0
    for gone in (a, c):
        assert not store.has(gone) and not store.in_snapshot(second, gone)
        with pytest.raises(TokenStoreError, match=gone.receipt_id):
            store.get(gone)
    with pytest.raises(TokenStoreError):
        store.chain(_call(1))  # its lineage link went with it
    assert store.get(b) == record(4)  # another call's record is untouched
    assert store.verify_snapshot(first) == [] and store.verify_snapshot(second) == []
    third = store.snapshot("ck-3")  # a snapshot taken after the release binds and verifies too
    assert third.count == second.count and store.verify_snapshot(third) == []

    # what is kept of a released record: its arrays' digest and its policy versions
    kept = store.released(a)
    rec = _big(300, 1)
    assert kept is not None and kept.segments == rec.segments
    assert kept.arrays_digest == arrays_digest(rec.prompt_ids, rec.output_ids, rec.logprobs)
    assert store.released(b) is None  # never released
    forged = TokenReceipt(receipt_id=a.receipt_id, count=a.count, digest="0" * 32)
    assert store.released(forged) is None  # the receipt must name the digest that was stored

    again = store.release([_call(1), _call(3), _call(99)])  # idempotent; unknown calls are skipped
    assert again.records_released == 0
    assert store.verify_snapshot(first) == [] and store.verify_snapshot(third) == []


def test_a_kept_snapshot_still_catches_a_damaged_record_and_a_forgotten_one_is_gone(
    store: LocalTokenStore,
) -> None:
    a, b = store.put(_call(1), record(3)), store.put(_call(2), record(5))
    old, kept = store.snapshot("ck-old"), store.snapshot("ck-kept")
    out = store.release([_call(1)], forget_snapshots=[old.snapshot_id])
    assert (out.records_released, out.snapshots_forgotten) == (1, 1)
    assert store.find_snapshot(old.snapshot_id) is None and store.find_snapshot(kept.snapshot_id) == kept
    assert store.verify_snapshot(kept) == []
    with store.env.begin(write=True) as txn:  # bit rot in a record the release left
        v = bytearray(txn.get(b.receipt_id.encode(), db=store._records))
        v[-2] ^= 0xFF
        txn.put(b.receipt_id.encode(), bytes(v), db=store._records)
    problems = store.verify_snapshot(kept)
    assert problems and b.receipt_id in problems[0]
    with store.env.begin(write=True) as txn:  # a record deleted behind the store's back is not a release
        txn.delete(b.receipt_id.encode(), db=store._records)
    assert store.verify_snapshot(kept) == [f"snapshot {kept.snapshot_id}: recomputed digest differs"]
    assert not store.has(a)


def test_the_store_does_not_grow_with_calls_released_as_fast_as_they_come(store: LocalTokenStore) -> None:
    """A long collection in miniature: rounds of calls, each round's released after the next checkpoint.
    The pages the store uses grow by what is kept of each released record (tens of bytes), not by
    its records (kilobytes): a round's growth is a small part of a round's records."""
    used = []
    for rnd in range(12):
        calls = [_call(rnd * 100 + i) for i in range(40)]
        for i, call in enumerate(calls):
            store.put(call, _big(400, rnd * 100 + i))
        store.snapshot(f"ck-{rnd}")
        if rnd:
            earlier = [_call((rnd - 1) * 100 + i) for i in range(40)]
            store.release(earlier, forget_snapshots=[f"snap-ck-{rnd - 2}"] if rnd >= 2 else [])
        used.append(store.used_bytes())
    per_round = (used[-1] - used[3]) / 8
    assert per_round * 10 < used[0], used  # a store that kept everything grows by used[0] a round
    last = store.find_snapshot("snap-ck-11")
    assert last is not None and store.verify_snapshot(last) == []
