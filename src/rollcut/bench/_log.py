"""``rollcut bench log``: the event log against plain nats-py on the same server, same run.

The workload imitates agent rollouts: per rollout a cycle of model-call
admitted/completed events, resources mutations with tool arguments and
results, and agent boundaries whose output items grow with the turn (so the
larger ones cross the compression threshold). The raw baseline publishes
byte strings of exactly the same sizes, with the same number of concurrent
writers each awaiting its ack, to a second stream on the same server. The
engine's ceiling publishes the same frames without waiting for acks (core
publishing, pipelined) to a third stream, timed until the server stored them
all: what the server can take from one client.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nats.js.api import StorageType, StreamConfig

from ..bus import (
    BusConfig,
    EmbeddedServer,
    Event,
    EventLog,
    ResultAccepted,
    RolloutEvent,
    TokenReceipt,
)
from ..ledger import rebuild_ledger
from ..replay import replay
from ._synthetic import turn_events

__all__ = ["bench_log", "workload"]

_TURNS = 5  # turns per rollout in bench log's workload: half the history belongs to finished rollouts

_WORDS = (
    "the", "agent", "calls", "a", "tool", "and", "reads",
    "the", "result", "then", "thinks", "about", "the", "next", "step",
)  # fmt: skip


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def workload(events: int, *, rollouts: int, seed: int = 0, turns: int = 0) -> list[Event]:
    """A deterministic list of ``events`` events spread over ``rollouts`` concurrent rollouts.

    With ``turns``, a rollout ends after that many turns (its result accepted) and a new one
    takes its place, as in a collection; without, every rollout runs to the end of the list.
    """
    rng = random.Random(seed)
    out: list[Event] = []
    turn = dict.fromkeys(range(rollouts), 0)
    generation = dict.fromkeys(range(rollouts), 0)
    i = 0
    while len(out) < events:
        r = i % rollouts
        i += 1
        if turns and turn[r] == turns:
            out.append(
                ResultAccepted(
                    component="collector",
                    instance="collector-0",
                    rollout_id=_rollout_id(r, generation[r]),
                    attempt=1,
                    result_digest=f"{rng.getrandbits(128):032x}",
                )
            )
            turn[r], generation[r] = 0, generation[r] + 1
            continue
        rid, t = _rollout_id(r, generation[r]), turn[r]
        turn[r] += 1
        call = f"c{r}-{t}"
        digest = f"{rng.getrandbits(128):032x}"
        cycle = turn_events(
            rid,
            t,
            call=call,
            digest=digest,
            parent=f"c{r}-{t - 1}" if t else None,
            admitted=True,
            receipt=TokenReceipt(
                receipt_id=f"rcpt-{call}", count=rng.randint(20, 400), digest=f"{rng.getrandbits(128):032x}"
            ),
            content=_text(rng, rng.randint(5, 60)),
            tool=(
                "search",
                {"query": _text(rng, 6)},
                _hits(rng),
            ),
            delta={"n": t + 1},
            outputs=[{"type": "message", "content": _text(rng, 30)} for _ in range(min(t + 1, 12))],
            usage={"input_tokens": 100 * (t + 1), "output_tokens": 40 * (t + 1)},
        )
        out.extend(cycle)
    return out[:events]


def _hits(rng: random.Random) -> dict[str, Any]:
    return {"hits": [_text(rng, 12) for _ in range(rng.randint(1, 8))]}


def _rollout_id(slot: int, generation: int) -> str:
    return f"bench-{slot:06d}" if generation == 0 else f"bench-{slot:06d}-{generation}"


def _rollout_ids(events: list[Event]) -> list[str]:
    """Every rollout a workload names, in the order they first appear (the order to dispatch them)."""
    return list(dict.fromkeys(e.rollout_id for e in events if isinstance(e, RolloutEvent)))


async def _drive(concurrency: int, n: int, op: Callable[[int], Any]) -> float:
    """Run op(0..n-1) with ``concurrency`` workers each awaiting its own ops; returns seconds."""
    nxt = iter(range(n))

    async def worker() -> None:
        for k in nxt:
            await op(k)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0


async def bench_log(
    *, events: int = 20_000, concurrency: int = 1024, url: str | None = None, seed: int = 0, repeat: int = 3
) -> dict[str, Any]:
    """Run the paired measurement ``repeat`` times on fresh streams; report medians.

    Each run measures rollcut and its raw baseline back to back, so a noisy
    neighbour slows both; the ratios are taken per run, then the median.
    """
    rollouts = max(1, events // 40)
    evs = workload(events, rollouts=rollouts, seed=seed, turns=_TURNS)
    with tempfile.TemporaryDirectory(prefix="rollcut-bench-") as tmp:
        server = None
        if url is None:
            server = EmbeddedServer(Path(tmp) / "nats").start()
            url = server.url
        store = Path(tmp) / "nats" if server is not None else None  # on-disk bytes: ours only
        try:
            runs = [
                await _run(url, evs, rollouts, concurrency, ledger=(i == 0), store=store)
                for i in range(max(1, repeat))
            ]
        finally:
            if server is not None:
                server.stop()
    out: dict[str, Any] = {
        "events": len(evs),
        "rollouts": rollouts,
        "concurrency": concurrency,
        "repeat": len(runs),
    }
    for key in runs[0]:
        vals = [r[key] for r in runs if key in r]
        out[key] = statistics.median(vals) if isinstance(vals[0], int | float) else vals[0]
    keys = ("append_vs_raw", "append_vs_ceiling", "replay_vs_raw", "streaming_vs_raw")
    out["runs"] = [{k: r[k] for k in keys} for r in runs]
    return out


def _disk_bytes(store: Path | None, stream: str) -> int | None:
    """What a stream's message blocks hold on disk (its ``msgs`` files under the server's store),
    or None where the store is not this process's to read (a server at ``--url``)."""
    if store is None:
        return None
    dirs = [d for d in store.rglob(stream) if d.is_dir() and d.parent.name == "streams"]
    return sum(f.stat().st_size for d in dirs for f in (d / "msgs").glob("*") if f.is_file()) or None


async def _run(
    url: str, evs: list[Event], rollouts: int, concurrency: int, *, ledger: bool, store: Path | None = None
) -> dict[str, Any]:
    ns = f"bench{os.urandom(4).hex()}"
    log = await EventLog.connect(BusConfig(url=url, namespace=ns), name="rollcut-bench")
    try:
        for i, rid in enumerate(_rollout_ids(evs)):
            await log.dispatch(rid, {"task": i}, instance="bench")
        frames = [log.codec.encode(e) for e in evs]
        subjects = [log.subjects.for_event(e) for e in evs]
        n = len(evs)

        append_s = await _drive(concurrency, n, lambda k: log.append(evs[k]))

        # raw baseline: plain nats-py, one acked publish per message, same sizes and concurrency
        js = log.nc.jetstream()
        raw_stream = f"RAW_{ns}"
        await js.add_stream(StreamConfig(name=raw_stream, subjects=[f"raw.{ns}.>"], storage=StorageType.FILE))
        raw_subjects = [f"raw.{ns}." + s.split(".", 2)[2] for s in subjects]
        raw_s = await _drive(concurrency, n, lambda k: js.publish(raw_subjects[k], frames[k]))

        # the engine's ceiling: the same frames published without waiting for acks (core publishing,
        # pipelined), timed until the server has stored them all
        top_stream = f"TOP_{ns}"
        await js.add_stream(StreamConfig(name=top_stream, subjects=[f"top.{ns}.>"], storage=StorageType.FILE))
        top_subjects = [f"top.{ns}." + s.split(".", 2)[2] for s in subjects]
        ceiling_s = await _ceiling(log.nc, js, top_stream, top_subjects, frames)

        info = await js.stream_info(log.stream)
        stream_bytes, stream_msgs = info.state.bytes, info.state.messages
        # on disk: S2 compresses a block when it is sealed, so the figure is the store's files, not
        # the logical bytes stream info reports; the raw baseline's stream is uncompressed
        disk, raw_disk = _disk_bytes(store, log.stream), _disk_bytes(store, raw_stream)

        t0 = time.perf_counter()
        res = await replay(log)
        replay_s = time.perf_counter() - t0
        replayed = res.events
        del res

        t0 = time.perf_counter()
        streamed = (await replay(log, keep_finished=False)).events
        streaming_s = time.perf_counter() - t0

        raw_read_s = await _raw_read(js, raw_stream, f"raw.{ns}.>", n)

        extra: dict[str, Any] = {}
        if ledger:
            extra["replay_retained_bytes_per_event"] = round(await _retained(log, True) / replayed)
            extra["streaming_retained_bytes_per_event"] = round(await _retained(log, False) / replayed)
            with tempfile.TemporaryDirectory(prefix="rollcut-ledger-") as ltmp:
                t0 = time.perf_counter()
                projected, _ = await rebuild_ledger(log, Path(ltmp) / "ledger")
                extra["ledger_rebuild_events"] = projected
                extra["ledger_rebuild_s"] = round(time.perf_counter() - t0, 3)
        await js.delete_stream(raw_stream)
        await js.delete_stream(top_stream)
        await js.delete_stream(log.stream)
    finally:
        stats = log.stats
        await log.close()
    payload = sum(map(len, frames)) / n
    append_rate, raw_rate, ceiling_rate = n / append_s, n / raw_s, n / ceiling_s
    replay_rate, raw_read_rate = replayed / replay_s, n / raw_read_s
    return {
        "append_events_per_s": round(append_rate),
        "raw_publish_per_s": round(raw_rate),
        "append_vs_raw": round(append_rate / raw_rate, 3),
        "ceiling_publish_per_s": round(ceiling_rate),
        "append_vs_ceiling": round(append_rate / ceiling_rate, 3),
        "replay_events_per_s": round(replay_rate),
        "raw_read_per_s": round(raw_read_rate),
        "replay_vs_raw": round(replay_rate / raw_read_rate, 3),
        "streaming_replay_events_per_s": round(streamed / streaming_s),
        "streaming_vs_raw": round(streamed / streaming_s / raw_read_rate, 3),
        **extra,
        "bytes_per_event": round(stream_bytes / max(1, stream_msgs), 1),
        "payload_bytes_per_event": round(payload, 1),
        **(
            {
                "disk_bytes_per_event": round(disk / n, 1),
                "disk_vs_payload": round(disk / n / payload, 3),
                "raw_disk_bytes_per_event": round(raw_disk / n, 1) if raw_disk else None,
            }
            if disk
            else {}
        ),
        "commit_batches": stats["batches"],
        "commit_singles": stats["singles"],
        "commit_fallbacks": stats["fallbacks"],
    }


async def _retained(log: EventLog, keep_finished: bool) -> int:
    """Bytes a whole replay's result holds once it is done (Python allocations still alive).

    Measured on a replay of its own: tracing allocations slows it several times."""
    gc.collect()
    tracemalloc.start()
    try:
        res = await replay(log, keep_finished=keep_finished)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del res
    return held


async def _ceiling(nc: Any, js: Any, stream: str, subjects: list[str], frames: list[bytes]) -> float:
    """Plain nats-py, no acks: every frame published back to back, the last one acknowledged (the
    server stores one connection's messages in order, so its ack comes after all the others)."""
    n = len(frames)
    t0 = time.perf_counter()
    for subject, frame in zip(subjects[:-1], frames[:-1], strict=True):
        await nc.publish(subject, frame)
    await js.publish(subjects[-1], frames[-1])
    elapsed = time.perf_counter() - t0
    stored = (await js.stream_info(stream)).state.messages
    if stored != n:
        raise RuntimeError(f"the ceiling run stored {stored} of {n} messages")
    return elapsed


async def _raw_read(js: Any, stream: str, subject: str, n: int) -> float:
    """Plain nats-py: an ordered consumer reading the whole raw stream."""
    done = asyncio.Event()
    count = 0

    async def cb(msg: Any) -> None:
        nonlocal count
        count += 1
        if count >= n:
            done.set()

    t0 = time.perf_counter()
    sub = await js.subscribe(subject, stream=stream, ordered_consumer=True, cb=cb, pending_msgs_limit=n + 1)
    await asyncio.wait_for(done.wait(), 300)
    elapsed = time.perf_counter() - t0
    await sub.unsubscribe()
    return elapsed
