"""``rollcut bench log --replicas 1 --replicas 3 --sync always``: what each durability mode costs.

Each mode is a real deployment started for the run: one nats-server (R1) or a three-node cluster on
loopback (R3), with JetStream's ``sync_interval`` at the server default or ``always``. Every mode
gets the same workload (``bench log``'s) appended by rollcut at the same concurrency, and the raw
baseline (plain nats-py, one acked publish per message) on a stream with the same replicas on the
same servers. Modes are measured in rounds, one run of each per round, so a noisy neighbour slows
every mode of a round; ratios are taken within a round, then the median and spread reported.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
from nats.js.api import StorageType, StreamConfig

from ..bus import BusConfig, Event, EventLog, embedded_nats, new_event_id
from ._log import _TURNS, _drive, _rollout_ids, workload

__all__ = ["bench_durability"]


def _mode_name(replicas: int, sync: str) -> str:
    return f"R{replicas} sync {sync}"


@contextlib.contextmanager
def _deployment(root: Path, replicas: int, sync: str) -> Iterator[str]:
    interval = None if sync == "default" else sync
    with embedded_nats(root / "nats", nodes=replicas, sync_interval=interval) as nats:
        yield nats.url


async def _one(url: str, replicas: int, evs: list[Event], concurrency: int) -> dict[str, float]:
    ns = f"dur{os.urandom(4).hex()}"
    log = await EventLog.connect(BusConfig(url=url, namespace=ns, replicas=replicas), name="rollcut-bench")
    try:
        for i, rid in enumerate(_rollout_ids(evs)):
            await log.dispatch(rid, {"task": i}, instance="bench")
        n = len(evs)
        append_s = await _drive(concurrency, n, lambda k: log.append(evs[k]))
        frames = [log.codec.encode(e) for e in evs]
        subjects = [log.subjects.for_event(e) for e in evs]
        js = log.nc.jetstream(timeout=30)
        raw = f"RAW_{ns}"
        await js.add_stream(
            StreamConfig(name=raw, subjects=[f"raw.{ns}.>"], storage=StorageType.FILE, num_replicas=replicas)
        )
        raw_subjects = [f"raw.{ns}." + s.split(".", 2)[2] for s in subjects]
        raw_s = await _drive(concurrency, n, lambda k: js.publish(raw_subjects[k], frames[k]))
        # a lone writer: what one append waits for when nothing shares its commit
        lone: list[float] = []
        for k in range(min(200, n)):
            t0 = time.perf_counter()
            await log.append(_again(evs[k]))
            lone.append(time.perf_counter() - t0)
        await js.delete_stream(raw)
        await js.delete_stream(log.stream)
    finally:
        await log.close()
    return {
        "append_events_per_s": n / append_s,
        "raw_publish_per_s": n / raw_s,
        "lone_append_p50_ms": statistics.median(lone) * 1000,
    }


def _again(ev: Event) -> Event:
    """The same event under a new id (a re-send of the old id would be deduplicated, not stored)."""
    return msgspec.structs.replace(ev, event_id=new_event_id())


async def bench_durability(
    *,
    events: int = 10_000,
    concurrency: int = 1024,
    replicas: list[int],
    syncs: list[str],
    repeat: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """Append rate and lone-append latency of every (replicas, sync) mode, with R1 at the server's
    default sync as the reference, measured side by side in one run."""
    modes = [(1, "default")] + [(r, s) for r in replicas for s in syncs if (r, s) != (1, "default")]
    rollouts = max(1, events // 40)
    evs = workload(events, rollouts=rollouts, seed=seed, turns=_TURNS)
    rounds: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="rollcut-durability-") as tmp, contextlib.ExitStack() as up:
        urls = {m: up.enter_context(_deployment(Path(tmp) / f"r{m[0]}-{m[1]}", *m)) for m in modes}
        for _ in range(max(1, repeat)):
            rounds.append({_mode_name(*m): await _one(urls[m], m[0], evs, concurrency) for m in modes})
    reference = _mode_name(1, "default")
    out: dict[str, Any] = {"events": len(evs), "concurrency": concurrency, "repeat": len(rounds), "modes": {}}
    for r, s in modes:
        name = _mode_name(r, s)
        runs = [rd[name] for rd in rounds]
        vs_r1 = [rd[name]["append_events_per_s"] / rd[reference]["append_events_per_s"] for rd in rounds]
        vs_raw = [x["append_events_per_s"] / x["raw_publish_per_s"] for x in runs]
        out["modes"][name] = {
            "replicas": r,
            "sync": s,
            "append_events_per_s": round(statistics.median(x["append_events_per_s"] for x in runs)),
            "raw_publish_per_s": round(statistics.median(x["raw_publish_per_s"] for x in runs)),
            "append_vs_raw": round(statistics.median(vs_raw), 3),
            "append_vs_r1_default": round(statistics.median(vs_r1), 3),
            "append_vs_r1_default_spread": [round(min(vs_r1), 3), round(max(vs_r1), 3)],
            "lone_append_p50_ms": round(statistics.median(x["lone_append_p50_ms"] for x in runs), 2),
        }
    return out
