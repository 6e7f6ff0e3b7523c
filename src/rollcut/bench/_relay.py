"""``rollcut bench relay``: what the journaling egress relay costs an opaque agent's model call.

One deployment: the model server (local backend, no per-token delay), a counter resources server
and the opaque agent server running :mod:`rollcut.bench.relay_load` as its agent. The load makes
its model calls alternately through the relay (journaled before the answer goes back) and straight
to the model server (custody, no relay): the raw baseline, in the same process, the same run, the
same moment. Then a checkpoint, and the same rollout continued as its next attempt: the load sends
the same requests again, and the relay answers every one from the journal (``replay_ms``), while the
direct ones are answered by the model server from its log.

Reported per repeat and over all: p50/p99 of each, the relay's added p50 and the ratio
direct/relay p50 (the throughput one agent keeps), with its spread.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from .._telemetry import percentile
from ..bus import BusConfig, EmbeddedServer, EventLog
from ..gym import AgentServe, ModelServe, ResourcesServe
from ..gym.opaque import Capability
from ..gym.wire import Identity, identity_headers
from ..ledger import Ledger
from ..participants import Coordinator
from ..testing import ServerProcess
from ..tokens import LocalTokenStore

__all__ = ["bench_relay"]

LOAD = Path(__file__).with_name("relay_load.py")
_NS = "benchrelay"


async def _run(http: httpx.AsyncClient, agent: str, model: str, rid: str, attempt: int, calls: int) -> Any:
    task = {
        "env": "counter",
        "prompt": "load",
        "calls": calls,
        "direct": model,
        "rollout": rid,
        "attempt": attempt,
    }
    resp = await http.post(f"{agent}/run", json=task, headers=identity_headers(Identity(rid, attempt)))
    resp.raise_for_status()
    return resp.json()["agent"]


def _ms(values: list[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 50, 3), "p99": percentile(values, 99, 3)}


def _spread(values: list[float]) -> dict[str, float | None]:
    return {
        "median": round(statistics.median(values), 3) if values else None,
        "min": round(min(values), 3) if values else None,
        "max": round(max(values), 3) if values else None,
    }


async def _continued(log: EventLog, ledger: Ledger, store: LocalTokenStore, rid: str) -> None:
    """A checkpoint, and the rollout's next attempt opened from its cut (as a recovery would)."""
    rec = (await Coordinator(log, ledger, store).checkpoint(deadline_s=30)).record
    await log.supersede(rid, 1, instance="bench", checkpoint_id=rec.checkpoint_id, from_cut=rec.cut)


async def bench_relay(*, calls: int = 100, repeat: int = 3) -> dict[str, Any]:
    """Per-call cost of the relay, live and replaying, against the model server called directly."""
    ms: dict[str, list[float]] = {"live": [], "direct": [], "replay": [], "reused": []}
    ratios: list[float] = []
    added: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="rollcut-benchrelay-") as tmp,
        EmbeddedServer(Path(tmp) / "nats") as nats,
        Ledger(Path(tmp) / "ledger") as ledger,
        LocalTokenStore(Path(tmp) / "tokens") as store,
    ):
        common: dict[str, Any] = {"url": nats.url, "namespace": _NS}
        started = [
            ServerProcess.serving(ModelServe(**common, tokens=str(Path(tmp) / "tokens"))).start(),
            ServerProcess.serving(ResourcesServe(**common, env="counter")).start(),
        ]
        model, counter = started
        opaque = AgentServe(
            **common,
            agent="opaque",
            model=model.url,
            resources={"counter": counter.url},
            command=f"{sys.executable} {LOAD}",
            capability=Capability.REPLAYABLE_EGRESS,
            # the load calls the model server directly too (the baseline), which a sandbox's program cannot
            # reach: this measures the relay, not the sandbox
            unisolated=True,
        )
        log = await EventLog.connect(BusConfig(url=nats.url, namespace=_NS))
        try:
            started.append(agent := ServerProcess.serving(opaque).start())
            async with httpx.AsyncClient(timeout=600) as http:
                for r in range(repeat):
                    rid = f"load-{r}"
                    await log.dispatch(rid, {"env": "counter"}, instance="bench")
                    first = await _run(http, agent.url, model.url, rid, 1, calls)
                    via, plain = statistics.median(first["relay_ms"]), statistics.median(first["direct_ms"])
                    ratios.append(plain / via)
                    added.append(via - plain)
                    await _continued(log, ledger, store, rid)
                    again = await _run(http, agent.url, model.url, rid, 2, calls)
                    for key, values in (
                        ("live", first["relay_ms"]),
                        ("direct", first["direct_ms"]),
                        ("replay", again["relay_ms"]),
                        ("reused", again["direct_ms"]),
                    ):
                        ms[key] += values
                stats = (await http.get(f"{agent.url}/rollcut/stats")).json()
        finally:
            await log.close()
            for p in started:
                p.close()
    return {
        "calls": sum(len(v) for v in ms.values()),
        "direct_ms": _ms(ms["direct"]),
        "relay_live_ms": _ms(ms["live"]),
        "relay_replay_ms": _ms(ms["replay"]),
        "direct_reused_ms": _ms(ms["reused"]),
        "added_p50_ms": _spread(added),
        "direct_over_relay_p50": _spread(ratios),
        "exchanges_live": stats.get("exchanges_live"),
        "exchanges_replayed": stats.get("exchanges_replayed"),
        "journaled_bytes": stats.get("journaled_bytes"),
    }
