"""The event log against a real nats-server: fencing, dedupe, order, reads up to a cut."""

from __future__ import annotations

import asyncio
import os

import msgspec
import pytest
from nats.js.api import StoreCompression

from rollcut import (
    AttemptConflictError,
    BusFullError,
    CorruptEventError,
    EventTooLargeError,
    RolloutExistsError,
    SchemaError,
    StaleAttemptError,
    StorageError,
    UnknownEventKindError,
)
from rollcut.bus import BusConfig, EventLog, ModelCallAdmitted

from ..helpers import model_event, mutation_event, raw_frame


async def _count(log: EventLog) -> int:
    info = await log.nc.jetstream().stream_info(log.stream)
    return int(info.state.messages)


async def test_server_refuses_stale_attempt_from_another_process_view(
    log: EventLog, bus_config: BusConfig
) -> None:
    """A writer that still believes attempt 1 is open is refused by the server itself."""
    await log.dispatch("r1", {"task": 1}, instance="collector-0")
    other = await EventLog.connect(bus_config, name="old-worker")
    try:
        await other.append(model_event("r1"))  # other caches attempt 1's fence
        assert await log.supersede("r1", 1, instance="coord") == 2
        before = await _count(log)
        with pytest.raises(StaleAttemptError) as info:
            await other.append(model_event("r1", call_id="late"))
        assert (info.value.rollout_id, info.value.attempt, info.value.current_attempt) == ("r1", 1, 2)
        assert "attempt 2 is current" in str(info.value)
        assert await _count(log) == before
        # the current attempt writes fine through the same stale-minded process
        await other.append(model_event("r1", attempt=2))
    finally:
        await other.close()


async def test_dispatch_once_and_fence_moves_only_forward(log: EventLog) -> None:
    await log.dispatch("r1", {"task": 1}, instance="c")
    with pytest.raises(RolloutExistsError):
        await log.dispatch("r1", {"task": 1}, instance="c")
    with pytest.raises(AttemptConflictError):
        await log.open_attempt("r1", 2, instance="c")  # attempt 1 not tombstoned yet
    await log.tombstone("r1", 1, instance="c")
    with pytest.raises(AttemptConflictError):
        await log.tombstone("r1", 1, instance="c")
    with pytest.raises(StaleAttemptError):
        await log.append(model_event("r1", attempt=1))
    await log.open_attempt("r1", 2, instance="c")
    state = await log.fence_state("r1")
    assert state is not None and (state.attempt, state.open) == (2, True)


async def test_concurrent_restorers_only_one_opens_next_attempt(log: EventLog, bus_config: BusConfig) -> None:
    await log.dispatch("r1", {}, instance="c")
    other = await EventLog.connect(bus_config)
    try:
        results = await asyncio.gather(
            log.supersede("r1", 1, instance="a"),
            other.supersede("r1", 1, instance="b"),
            return_exceptions=True,
        )
    finally:
        await other.close()
    assert sorted(type(r).__name__ for r in results) == ["AttemptConflictError", "int"]


async def test_retried_append_is_stored_once(log: EventLog) -> None:
    await log.dispatch("r1", {}, instance="c")
    ev = model_event("r1")
    first = await log.append(ev)
    before = await _count(log)
    assert await log.append(ev) == first
    assert await _count(log) == before


async def test_stale_event_in_a_batch_fails_alone(log: EventLog) -> None:
    """A batch rejected for one stale event still commits every other event."""
    for r in ("fresh", "old"):
        await log.dispatch(r, {}, instance="c")
    old_fence = log._open["old"]
    await log.supersede("old", 1, instance="coord")
    log._open["old"] = old_fence  # this process still believes attempt 1 is open
    events = [model_event("fresh", call_id=f"f{i}") for i in range(40)]
    events.insert(20, model_event("old", call_id="stale"))
    results = await asyncio.gather(*(log.append(e) for e in events), return_exceptions=True)
    stale = [r for r in results if isinstance(r, Exception)]
    assert len(stale) == 1 and isinstance(stale[0], StaleAttemptError)
    assert log.stats["batches"] >= 1 and log.stats["fallbacks"] >= 1
    stored = [s.event.call_id async for s in log.read(rollout_id="fresh", attempt=1)]
    assert sorted(stored) == sorted(f"f{i}" for i in range(40))
    assert [s async for s in log.read(rollout_id="old", attempt=1)] == []


async def test_a_few_concurrent_appends_go_as_publishes_in_order_and_a_stale_one_fails_alone(
    log: EventLog,
) -> None:
    """Fewer than ``min_batch`` appends queued together leave as acknowledged publishes, not an atomic
    batch (which costs the server a staging store of its own each time): each stored in the order
    sent, a stale one refused alone."""
    for r in ("fresh", "old"):
        await log.dispatch(r, {}, instance="c")
    old_fence = log._open["old"]
    await log.supersede("old", 1, instance="coord")
    log._open["old"] = old_fence  # this process still believes attempt 1 is open
    before = log.stats
    events = [model_event("fresh", call_id=f"f{i}") for i in range(6)]
    events.insert(3, model_event("old", call_id="stale"))
    assert len(events) < log.config.min_batch
    results = await asyncio.gather(*(log.append(e) for e in events), return_exceptions=True)
    assert [type(r).__name__ for r in results] == ["int"] * 3 + ["StaleAttemptError"] + ["int"] * 3
    seqs = [r for r in results if isinstance(r, int)]
    assert seqs == sorted(seqs)  # stored in the order sent
    after = log.stats
    assert after["batches"] == before["batches"] and after["fallbacks"] == before["fallbacks"]
    assert after["singles"] - before["singles"] == len(events)
    stored = [s.event.call_id async for s in log.read(rollout_id="fresh", attempt=1)]
    assert stored == [f"f{i}" for i in range(6)]


async def test_read_is_in_stream_order_and_stops_at_the_cut(log: EventLog) -> None:
    await log.dispatch("a", {}, instance="c")
    await log.dispatch("b", {}, instance="c")
    seqs = []
    for i in range(30):
        seqs.append(await log.append(model_event("a" if i % 2 else "b", call_id=f"x{i}")))
    everything = [s async for s in log.read()]
    assert [s.seq for s in everything] == sorted(s.seq for s in everything)
    assert [s.seq for s in everything][-30:] == seqs
    assert all(s.subject == log.subjects.for_event(s.event) for s in everything)
    cut = seqs[9]
    upto = [s async for s in log.read(up_to=cut)]
    assert upto[-1].seq == cut and len(upto) == 12
    only_a = [s async for s in log.read(rollout_id="a", up_to=cut)]
    assert only_a[0].event.__struct_config__.tag == "rollout.dispatched"
    assert {s.event.rollout_id for s in only_a} == {"a"}
    assert [s.seq for s in only_a] == sorted(s.seq for s in only_a)
    assert len(only_a) == 1 + 5


async def test_read_pages_through_many_events(log: EventLog) -> None:
    await log.dispatch("r", {}, instance="c")
    seqs = await log.append_many([model_event("r", call_id=f"p{i}") for i in range(5000)])
    got = [s.seq async for s in log.read(rollout_id="r", attempt=1)]
    assert got == sorted(seqs)
    assert len([s async for s in log.read(start=seqs[100], up_to=seqs[4200])]) == 4101


async def test_the_next_page_is_asked_for_before_a_page_is_handed_out(log: EventLog) -> None:
    """A caller decodes a page without awaiting; the next page's request must already be on the
    wire then, or the server idles while the caller works, and a read costs their sum."""
    from rollcut.bus._read import scan

    await log.dispatch("r", {}, instance="c")
    seqs = await log.append_many([model_event("r", call_id=f"p{i}") for i in range(45)])
    before = log.nc.stats["out_msgs"]
    pages = scan(log.nc, log.stream, page=10)
    first = await anext(pages)
    assert log.nc.stats["out_msgs"] - before == 2, "the second page was not asked for yet"
    rest = [m.seq for pg in [pg async for pg in pages] for m in pg]
    assert [m.seq for m in first] + rest == [seqs[0] - 1, *seqs]


async def test_claims_of_one_attempt_by_several_instances_at_once_let_one_win(log: EventLog) -> None:
    """Each instance writes on its own subject, so a claim checks across all of them (a wildcard);
    claims sent together on one connection must not share an atomic batch, where the server checks
    each against the stream as it was before the batch (all four won)."""
    from rollcut.bus import AttemptClaimed

    await log.dispatch("r", {}, instance="c")
    claims = [
        AttemptClaimed(component="agent", instance=f"agent-w{i}", rollout_id="r", attempt=1) for i in range(4)
    ]
    won = [seq for seq in await asyncio.gather(*(log.claim(c) for c in claims)) if seq is not None]
    assert len(won) == 1
    stored = [s async for s in log.read(rollout_id="r", attempt=1) if isinstance(s.event, AttemptClaimed)]
    assert [s.seq for s in stored] == won


async def test_corrupt_payload_is_reported_with_its_sequence(log: EventLog) -> None:
    await log.dispatch("r1", {}, instance="c")
    good = await log.append(model_event("r1"))
    frame = bytearray(log.codec.encode(model_event("r1")))
    frame[-1] ^= 0x55
    ack = await log.nc.jetstream().publish(log.subjects.event("r1", 1, "model"), bytes(frame))
    with pytest.raises(CorruptEventError) as info:
        _ = [s async for s in log.read()]
    assert info.value.seq == ack.seq and info.value.subject == f"rc.{log.subjects.namespace}.ev.r1.1.model"
    lenient = [s async for s in log.read(strict=False)]
    assert [s.seq for s in lenient if s.error] == [ack.seq]
    assert lenient[-1].subject.endswith(".ev.r1.1.model")
    assert any(s.seq == good and s.event is not None for s in lenient)


async def test_unknown_kind_on_the_stream_is_named(log: EventLog) -> None:
    import msgspec

    await log.dispatch("r1", {}, instance="c")
    raw = msgspec.to_builtins(model_event("r1"))
    raw["kind"] = "hologram.emitted"
    await log.nc.jetstream().publish(log.subjects.event("r1", 1, "model"), raw_frame(raw))
    with pytest.raises(UnknownEventKindError, match=r"hologram\.emitted"):
        _ = [s async for s in log.read()]


async def test_oversize_and_invalid_events_store_nothing(log: EventLog) -> None:
    await log.dispatch("r1", {}, instance="c")
    before = await _count(log)
    huge = mutation_event(state=os.urandom(2 * 1024 * 1024))
    with pytest.raises(EventTooLargeError):
        await log.append(huge)
    bad = ModelCallAdmitted(
        component="model",
        instance="m",
        rollout_id="r1",
        attempt=1,
        call_id="has space",
        request_digest="ab" * 8,
    )
    with pytest.raises(SchemaError, match=r"call_id"):
        await log.append(bad)
    assert await _count(log) == before


async def test_an_append_to_a_full_stream_is_a_storage_error_and_stores_nothing(log: EventLog) -> None:
    await log.dispatch("r1", {"q": 1}, instance="c")
    js = log.nc.jetstream()
    info = await js.stream_info(log.stream)
    cfg = info.config
    cfg.max_bytes = info.state.bytes + 16
    await js.update_stream(cfg)
    with pytest.raises(BusFullError) as caught:
        await log.dispatch("r2", {"q": "x" * 500}, instance="c")
    assert isinstance(caught.value, StorageError) and caught.value.rollout_id == "r2"
    assert caught.value.subject is not None and "r2" in caught.value.subject
    assert [s.event.rollout_id async for s in log.read()] == ["r1"]


async def test_the_stream_is_created_s2_compressed_unless_told_otherwise(bus_config: BusConfig) -> None:
    """Every event carries ~200 bytes of repetitive headers; the stream's sealed blocks are stored
    S2-compressed (docs/event-log.md), and ``compression: none`` keeps a stream as it is."""
    for how, expected in (("s2", StoreCompression.S2), ("none", StoreCompression.NONE)):
        config = msgspec.structs.replace(
            bus_config, namespace=f"{bus_config.namespace}{how}", compression=how
        )
        log = await EventLog.connect(config)
        try:
            info = await log.nc.jetstream().stream_info(log.stream)
            assert info.config.compression == expected, how
            await log.nc.jetstream().delete_stream(log.stream)
        finally:
            await log.close()
