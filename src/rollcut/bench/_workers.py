"""``rollcut bench workers``: what routing a rollout's call to the worker that holds it costs.

A counter resources server with one worker (the raw baseline: every call is
answered where it arrives) and the same server with two workers, in the same
run. Calls go over a fresh connection each (the kernel picks the accepting
worker), so about half of the two-worker calls are forwarded to their owner
over its unix socket; the answer says which (``x-rollcut-forwarded-to``).
Reported: per-call latency of the one-worker server, of answered-in-place and
of forwarded calls, and the forwarded/in-place ratio per repeat (its spread).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from .._telemetry import percentile
from ..bus import BusConfig, EmbeddedServer, EventLog
from ..gym import FORWARDED_HEADER
from ..gym.wire import SESSION_COOKIE, Identity, identity_headers
from ..testing import ServerProcess

__all__ = ["bench_workers"]


async def _calls(
    url: str, log: EventLog, tag: str, rollouts: int, calls: int
) -> tuple[list[float], list[float]]:
    """(in place, forwarded) latencies in ms of ``calls`` tool calls on each of ``rollouts`` sessions."""
    here: list[float] = []
    there: list[float] = []
    for i in range(rollouts):
        rid = f"{tag}-{i}"
        await log.dispatch(rid, {}, instance="bench")
        async with httpx.AsyncClient() as c:
            seeded = await c.post(f"{url}/seed_session", json={}, headers=identity_headers(Identity(rid, 1)))
        cookie = seeded.cookies[SESSION_COOKIE]
        for _ in range(calls):
            async with httpx.AsyncClient(cookies={SESSION_COOKIE: cookie}) as c:  # a fresh connection
                t0 = time.perf_counter()
                resp = await c.post(f"{url}/add", json={"n": 1})
                ms = (time.perf_counter() - t0) * 1000
            resp.raise_for_status()
            (there if FORWARDED_HEADER in resp.headers else here).append(ms)
    return here, there


def _spread(values: list[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 50, 3), "p99": percentile(values, 99, 3)}


async def bench_workers(*, rollouts: int = 20, calls: int = 25, repeat: int = 3) -> dict[str, Any]:
    """Per-call cost of routing among workers, against one worker, in the same run."""
    single: list[float] = []
    here: list[float] = []
    there: list[float] = []
    ratios: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="rollcut-benchworkers-") as tmp,
        EmbeddedServer(Path(tmp) / "nats") as nats,
    ):
        log = await EventLog.connect(BusConfig(url=nats.url, namespace="benchworkers"))
        common = ["--url", nats.url, "--namespace", "benchworkers"]
        one = ServerProcess(["resources", "counter", *common])
        two = ServerProcess(["resources", "counter", *common, "--workers", "2"], workers=2)
        try:
            one.start(), two.start()
            for r in range(repeat):
                s, _ = await _calls(one.url, log, f"one{r}", rollouts, calls)
                h, t = await _calls(two.url, log, f"two{r}", rollouts, calls)
                single += s
                here += h
                there += t
                if h and t:
                    ratios.append(statistics.median(t) / statistics.median(h))
        finally:
            one.kill()
            two.kill()
            await log.close()
    return {
        "calls": len(single) + len(here) + len(there),
        "one_worker_ms": {"p50": percentile(single, 50, 3), "p99": percentile(single, 99, 3)},
        "two_workers_in_place_ms": {
            "p50": percentile(here, 50, 3),
            "p99": percentile(here, 99, 3),
            "calls": len(here),
        },
        "two_workers_forwarded_ms": {
            "p50": percentile(there, 50, 3),
            "p99": percentile(there, 99, 3),
            "calls": len(there),
        },
        "forwarded_over_in_place_p50": {
            "median": round(statistics.median(ratios), 3) if ratios else None,
            "min": round(min(ratios), 3) if ratios else None,
            "max": round(max(ratios), 3) if ratios else None,
        },
    }
