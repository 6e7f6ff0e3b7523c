"""The LMDB ledger: projection, rebuild equality, and refusing what it cannot read."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import msgspec
import pytest

from rollcut import LedgerCorruptError, LedgerError, LedgerSchemaError
from rollcut.bus import CheckpointCommitted, EventLog, ResultAccepted, RolloutCompleted
from rollcut.ledger import LEDGER_SCHEMA_VERSION, Ledger, Projector, RolloutIndex, rebuild_ledger

from ..helpers import boundary_event, counter_event, model_event


def _digest_dir(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir()) if p.is_file()}


async def _history_round(log: EventLog, k: int) -> None:
    r = f"r{k}"
    await log.dispatch(r, {"task": k}, instance="collector-0")
    for t in range(3):
        await log.append(model_event(r, call_id=f"{r}c{t}"))
        await log.append(counter_event(r, t + 1, t))
        await log.append(boundary_event(r, t))
    if k % 3 == 0:
        await log.supersede(r, 1, instance="coord")
        await log.append(boundary_event(r, 9, attempt=2))
    if k % 2 == 0:
        attempt = 2 if k % 3 == 0 else 1
        await log.append(
            RolloutCompleted(
                component="environment",
                instance="env-0",
                rollout_id=r,
                attempt=attempt,
                result_digest="aa" * 8,
                reward=1.0,
            )
        )
        await log.append(
            ResultAccepted(
                component="collector",
                instance="collector-0",
                rollout_id=r,
                attempt=attempt,
                result_digest="aa" * 8,
                reward=1.0,
            )
        )
    cut = await log.last_seq()
    await log.append(
        CheckpointCommitted(
            component="coordinator",
            instance="coord",
            checkpoint_id=f"ck{k}",
            cut=cut,
            token_snapshot_id=f"snap{k}",
            token_snapshot_digest="bb" * 8,
        )
    )


async def test_rebuilt_ledger_equals_the_incremental_one(log: EventLog, tmp_path: Path) -> None:
    with Ledger(tmp_path / "inc") as inc:
        proj = Projector(inc, log)
        for k in range(7):
            await _history_round(log, k)
            await proj.catch_up()  # incremental: one round at a time
        assert inc.watermark == await log.last_seq()
        n, kept = await rebuild_ledger(log, tmp_path / "rebuilt")
        assert kept is None and n == inc.watermark
        with Ledger(tmp_path / "rebuilt") as reb:
            assert reb.dump() == inc.dump()
        # spot-check the projection's meaning
        r0 = inc.rollout("r0")
        assert r0 is not None
        assert (r0.current_attempt, r0.status, r0.tombstoned_attempts, r0.last_boundary_turn) == (
            2,
            "accepted",
            [1],
            9,
        )
        r1 = inc.rollout("r1")
        assert r1 is not None and (r1.status, r1.last_boundary_turn, r1.accepted_seq) == ("running", 2, None)
        assert [c.checkpoint_id for c in inc.checkpoints()] == [f"ck{k}" for k in range(7)]
        latest = inc.latest_checkpoint()
        assert latest is not None and latest.checkpoint_id == "ck6"


async def test_projection_resumes_from_its_watermark(log: EventLog, tmp_path: Path) -> None:
    await _history_round(log, 1)
    with Ledger(tmp_path / "l") as led:
        first = await Projector(led, log).catch_up()
    with Ledger(tmp_path / "l") as led:
        assert await Projector(led, log).catch_up() == 0
        await _history_round(log, 2)
        assert await Projector(led, log).catch_up() == (await log.last_seq()) - first


async def test_projectors_running_at_once_apply_each_event_once(log: EventLog, tmp_path: Path) -> None:
    """The background validator and a recovery's plan each project the same ledger, interleaved page
    by page on one event loop: the result is the ledger one projector would have built."""
    for k in range(7):
        await _history_round(log, k)
    with Ledger(tmp_path / "one") as one, Ledger(tmp_path / "many") as many:
        await Projector(one, log).catch_up()
        seen: list[int] = []
        applied = await asyncio.gather(
            Projector(many, log).catch_up(),
            Projector(many, log).catch_up(start=1, on_events=lambda page: seen.extend(s.seq for s in page)),
            Projector(many, log).catch_up(up_to=20),
        )
        assert sum(applied) == many.watermark == await log.last_seq()  # each event applied once
        assert seen == list(range(1, many.watermark + 1))  # a reader from 1 saw every page, in order
        assert many.dump() == one.dump()


def test_newer_schema_ledger_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "l"
    with Ledger(path) as led, led.write() as wb:
        wb.set_meta("schema_version", LEDGER_SCHEMA_VERSION + 1)
    before = _digest_dir(path)
    with pytest.raises(LedgerSchemaError, match=f"schema_version {LEDGER_SCHEMA_VERSION + 1}"):
        Ledger(path)
    assert _digest_dir(path)["data.mdb"] == before["data.mdb"]


def test_corrupted_ledger_file_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "l"
    with Ledger(path) as led, led.write() as wb:
        wb.set_meta("watermark", 5)
    data = path / "data.mdb"
    blob = bytearray(data.read_bytes())
    blob[0:4096] = os.urandom(4096)  # both meta pages live in the first pages
    blob[4096:8192] = os.urandom(4096)
    data.write_bytes(bytes(blob))
    before = hashlib.sha256(data.read_bytes()).hexdigest()
    with pytest.raises(LedgerCorruptError, match="rollcut ledger rebuild"):
        Ledger(path)
    assert hashlib.sha256(data.read_bytes()).hexdigest() == before


def test_corrupted_record_is_reported_with_its_key(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l") as led:
        with led.write() as wb:
            wb.txn.put(b"r1", b"\xc1garbage", db=led._db["rollouts"])
        with pytest.raises(LedgerCorruptError, match=r"rollouts\[b'r1'\]"):
            led.rollout("r1")


async def test_ledger_of_another_stream_is_refused(log: EventLog, tmp_path: Path) -> None:
    await _history_round(log, 1)
    with Ledger(tmp_path / "l") as led:
        with led.write() as wb:
            wb.set_meta("stream", "RC_someone_else")
        with pytest.raises(LedgerError, match="RC_someone_else"):
            await Projector(led, log).catch_up()


async def test_rebuild_keeps_the_old_ledger_beside_the_new(log: EventLog, tmp_path: Path) -> None:
    await _history_round(log, 3)
    path = tmp_path / "ledger"
    with Ledger(path) as led, led.write() as wb:
        wb.set_meta("schema_version", LEDGER_SCHEMA_VERSION + 5)
    n, kept = await rebuild_ledger(log, path)
    assert kept is not None and kept.exists() and n == await log.last_seq()
    with Ledger(path) as led:
        assert led.rollout("r3") is not None
        assert msgspec.msgpack.decode(led.dump()["meta"][b"schema_version"]) == LEDGER_SCHEMA_VERSION


def test_compaction_finds_the_rollouts_accepted_in_its_range_without_reading_the_rest(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger") as ledger:
        with ledger.write() as wb:
            for i, seq in enumerate([40, 7, None, 12, 99]):
                wb.put_rollout(RolloutIndex(rollout_id=f"r{i}", accepted_seq=seq))
        assert ledger.accepted_between(0, 1000) == ["r1", "r3", "r0", "r4"]  # in log order
        assert ledger.accepted_between(7, 40) == ["r3", "r0"]  # after the first, up to the second
        assert ledger.accepted_between(99, 1000) == []


def test_a_ledger_from_before_the_accepted_index_is_indexed_when_opened(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger") as ledger:
        with ledger.write() as wb:
            wb.put_rollout(RolloutIndex(rollout_id="old", accepted_seq=3))
        with ledger.env.begin(write=True) as txn:  # as such a ledger is: neither the index nor its mark
            txn.drop(ledger._db["accepted"], delete=True)
            txn.delete(b"accepted_index", db=ledger._db["meta"])
    with Ledger(tmp_path / "ledger", readonly=True) as ledger:
        assert ledger.accepted_between(0, 10) == ["old"]  # read only: found by reading every rollout
        assert "accepted" not in ledger.dump()  # ... and nothing written
    with Ledger(tmp_path / "ledger") as ledger:
        assert ledger.accepted_between(0, 10) == ["old"]
