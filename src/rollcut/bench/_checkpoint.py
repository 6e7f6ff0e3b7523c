"""``rollcut bench checkpoint``: rollcut's checkpoint against file-based designs, on the same state.

Setup: N active rollouts, each with a realistic history (dispatch, a model
call with its token record in the store, a resources mutation, an agent
boundary), and three participants (model, resources exported, agent) on
their own connections. Three cases, each repeated:

- **cold**: the first checkpoint of a fresh ledger over the whole history
  (every event projected and validated);
- **moved 1%** and **moved 100%**: one more turn of that share of the rollouts
  since the last checkpoint (with checkpoints every 30 s in a collection, most
  rollouts move: 100% is the regime that matters).

For each: ``pause_ms`` (the collection stands still: prepare, seal, release),
``publish_ms`` (validation and the ledger write, after everyone went on) and
``checkpoint_ms`` (start to publication). In the moved cases the coordinator's
validator keeps up with the stream between checkpoints, as in a collection
(``background_ms``: the projection and reference checks it did before the
checkpoint, off every critical path); cold is the worst case, a first
checkpoint with all the history still to check. And, on the state at the same cut,
the NeMo-style and per-file baselines (``_baselines``), which stop the world
for their whole duration. Ratios are baseline time over rollcut's (above 1:
rollcut is faster), taken per repeat; each figure is reported as its median
and spread (min, max).
"""

from __future__ import annotations

import asyncio
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from ..bus import (
    BusConfig,
    EventLog,
    embedded_nats,
)
from ..ledger import Ledger, rebuild_ledger
from ..participants import Coordinator, Participant
from ..replay import replay
from ..tokens import LocalTokenStore, TokenRecord
from ._baselines import BASELINES, baseline_checkpoint
from ._spread import spread
from ._synthetic import turn_events

__all__ = ["bench_checkpoint"]

_PARTS = (
    ("model-0", "model", "event_sourced"),
    ("res-0", "resources", "exported"),
    ("agent-0", "agent", "event_sourced"),
)


def _turn(rid: str, t: int, receipt: Any) -> list[Any]:
    return turn_events(
        rid,
        t,
        call=f"{rid}-c{t}",
        receipt=receipt,
        content=f"turn {t} of {rid}",
        tool=("edit", {"line": t}, {"ok": True}),
        delta={"n": t},
        outputs=[{"type": "message", "content": f"t{t}"}],
        usage={"input_tokens": 100 * (t + 1)},
    )


async def bench_checkpoint(
    *,
    rollouts: int = 10_000,
    url: str | None = None,
    moved: tuple[int, ...] = (1, 100),
    repeat: int = 3,
    baselines: tuple[str, ...] = BASELINES,
    cluster: int = 1,
) -> dict[str, Any]:
    """Pause and publication time of rollcut's checkpoint against the NeMo-style and per-file
    designs on the same state: cold, and with ``moved`` percent of the rollouts moved since. With
    ``cluster`` > 1, on that many nats-server nodes started for the run, the stream at 3 replicas."""
    with tempfile.TemporaryDirectory(prefix="rollcut-benchck-") as tmp:
        root = Path(tmp)
        server = None
        if url is None:
            server = embedded_nats(root / "nats", nodes=cluster).start()
            url = server.url
        try:
            return await _run(root, url, rollouts, moved, max(1, repeat), baselines, min(cluster, 3))
        finally:
            if server is not None:
                server.stop()


async def _run(
    root: Path,
    url: str,
    n: int,
    moved: tuple[int, ...],
    repeat: int,
    baselines: tuple[str, ...],
    replicas: int = 1,
) -> dict[str, Any]:
    cfg = BusConfig(url=url, namespace=f"benchck{os.urandom(3).hex()}", replicas=replicas)
    log = await EventLog.connect(cfg, name="bench-coordinator")
    plogs = [await EventLog.connect(cfg, name=f"bench-{name}") for name, _, _ in _PARTS]
    parts = [
        await Participant(pl, component=comp, instance=name, mode=mode).start()  # type: ignore[arg-type]
        for pl, (name, comp, mode) in zip(plogs, _PARTS, strict=True)
    ]
    tokens = LocalTokenStore(root / "tokens")
    ledgers: list[Ledger] = []
    cases: dict[str, dict[str, list[float]]] = {}
    out: dict[str, Any] = {"rollouts": n, "participants": len(parts), "repeat": repeat, "replicas": replicas}
    try:
        rids = [f"r{i:06d}" for i in range(n)]
        for rid in rids:
            await log.dispatch(rid, {"task": rid}, instance="collector-0")
        turns = [0]

        async def one_turn(ids: list[str]) -> None:
            t = turns[0] = turns[0] + 1
            for chunk in range(0, len(ids), 1000):
                evs = []
                for rid in ids[chunk : chunk + 1000]:
                    rc = tokens.put(
                        f"{rid}-c{t}", TokenRecord(prompt_ids=list(range(32)), output_ids=list(range(16)))
                    )
                    evs += _turn(rid, t, rc)
                by_part = {name: [e for e in evs if e.instance == name] for name, _, _ in _PARTS}
                await asyncio.gather(*(p.log.append_many(by_part[p.instance]) for p in parts))

        async def measure(case: str, coord: Coordinator, *, tailing: bool) -> None:
            got = cases.setdefault(case, {})
            if tailing:  # what the validator does in the background between two checkpoints
                t0 = time.perf_counter()
                async with coord.validator.lock:
                    await coord.validator.feed()
                got.setdefault("background_ms", []).append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            res = await coord.checkpoint(deadline_s=600)
            total = (time.perf_counter() - t0) * 1000
            states = await _state(log, res.record.cut)
            for kind in baselines:
                where = root / "baselines" / f"{kind}-{case}-{len(got.get('pause_ms', []))}"
                ms, files = baseline_checkpoint(kind, where, states)
                got.setdefault(f"{kind}_ms", []).append(ms)
                got.setdefault(f"vs_{kind}_publish", []).append(ms / total)
                got.setdefault(f"vs_{kind}_pause", []).append(ms / max(res.pause_ms, 1e-3))
                out[f"{kind}_files_created"] = files
            got.setdefault("pause_ms", []).append(res.pause_ms)
            got.setdefault("publish_ms", []).append(res.publish_ms)
            got.setdefault("checkpoint_ms", []).append(total)
            got.setdefault("validated_events", []).append(res.validated_events)
            out["events"] = res.record.cut

        await one_turn(rids)
        for i in range(repeat):  # cold: a fresh ledger over the whole history
            ledgers.append(Ledger(root / f"ledger-cold-{i}"))
            await measure("cold", Coordinator(log, ledgers[-1], tokens), tailing=False)
        coord = Coordinator(log, ledgers[-1], tokens)
        for pct in moved:
            for _ in range(repeat):
                await one_turn(rids[: max(1, n * pct // 100)])
                await measure(f"moved_{pct}", coord, tailing=True)
        t0 = time.perf_counter()
        out["ledger_rebuild_events"], _ = await rebuild_ledger(log, root / "ledger-rebuilt")
        out["ledger_rebuild_s"] = round(time.perf_counter() - t0, 2)
        # the coordinator's process (participants and baselines run here too: an upper bound)
        out["coordinator_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    finally:
        for p in parts:
            await p.stop()
        for pl in plogs:
            await pl.close()
        await log.close()
        for led in ledgers:
            led.close()
        tokens.close()
    out["cases"] = {case: {k: spread(v, 2) for k, v in got.items()} for case, got in cases.items()}
    return out


async def _state(log: EventLog, cut: int) -> dict[str, dict[str, bytes]]:
    """Each participant's sessions at the cut, one JSON blob per rollout: what a baseline writes."""
    state = await replay(log, up_to=cut)
    blobs: dict[str, dict[str, bytes]] = {name: {} for name, _, _ in _PARTS}
    for rid, st in state.rollouts.items():
        a = st.current()
        if a is None:
            continue
        for name, comp, _ in _PARTS:
            blobs[name][rid] = msgspec.json.encode(a.sessions.get(comp))
    return blobs
