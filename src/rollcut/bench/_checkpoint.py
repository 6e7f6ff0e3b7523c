"""``rollcut bench checkpoint``: a sealed cut against per-rollout checkpoint files.

Setup: N active rollouts, each with a realistic history (dispatch, a model
call with its token record in the store, a resources mutation, an agent
boundary), and three participants (model, resources exported, agent) on
their own connections. rollcut's checkpoint is measured twice: the first
one validates the whole history (cold), the second only what happened since
(steady state, after one more turn of 1% of the rollouts). ``checkpoint_ms``
is the steady-state time from the start to publication.

Baseline, same run, same state: a file-based design as in the original
proposal. Each participant writes each rollout's state to its own file
(write, fsync, rename), then a manifest of digests (written last, fsynced);
then an aggregate manifest. Participants write concurrently, one thread each,
as separate processes would.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from ..bus import (
    AgentBoundary,
    AgentBoundaryRecord,
    BusConfig,
    EmbeddedServer,
    EventLog,
    ModelCallCompleted,
    ResourcesMutated,
)
from ..ledger import Ledger
from ..participants import Coordinator, Participant
from ..replay import replay
from ..tokens import LocalTokenStore, TokenRecord

__all__ = ["bench_checkpoint"]

_PARTS = (
    ("model-0", "model", "event_sourced"),
    ("res-0", "resources", "exported"),
    ("agent-0", "agent", "event_sourced"),
)


def _turn(rid: str, t: int, receipt: Any) -> list[Any]:
    call = f"{rid}-c{t}"
    return [
        ModelCallCompleted(
            component="model",
            instance="model-0",
            rollout_id=rid,
            attempt=1,
            call_id=call,
            request_digest="ab" * 8,
            receipt=receipt,
            response={"role": "assistant", "content": f"turn {t} of {rid}"},
        ),
        ResourcesMutated(
            component="resources",
            instance="res-0",
            rollout_id=rid,
            attempt=1,
            session="env",
            revision=t + 1,
            tool="edit",
            arguments={"line": t},
            result={"ok": True},
            delta={"n": t},
        ),
        AgentBoundary(
            component="agent",
            instance="agent-0",
            rollout_id=rid,
            attempt=1,
            record=AgentBoundaryRecord(
                turn=t,
                output_items=[{"type": "message", "content": f"t{t}"}],
                usage={"input_tokens": 100 * (t + 1)},
                last_model_call_id=call,
                resources_revisions={"env": t + 1},
            ),
        ),
    ]


def _files(*dirs: Path) -> set[str]:
    return {str(p) for d in dirs if d.exists() for p in d.rglob("*") if p.is_file()}


def _write_durable(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)


def _baseline_participant(root: Path, name: str, states: dict[str, bytes]) -> int:
    d = root / name
    d.mkdir(parents=True)
    digests = {}
    for rid, blob in states.items():
        _write_durable(d / f"{rid}.msgpack", blob)
        digests[rid] = hashlib.blake2b(blob, digest_size=16).hexdigest()
    _write_durable(d / "manifest.json", msgspec.json.encode(digests))
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return len(states) + 1


async def bench_checkpoint(*, rollouts: int = 10_000, url: str | None = None) -> dict[str, Any]:
    """Checkpoint time and files against a per-rollout-file checkpoint of the same state."""
    with tempfile.TemporaryDirectory(prefix="rollcut-benchck-") as tmp:
        root = Path(tmp)
        server = None
        if url is None:
            server = EmbeddedServer(root / "nats").start()
            url = server.url
        try:
            return await _run(root, url, rollouts)
        finally:
            if server is not None:
                server.stop()


async def _run(root: Path, url: str, n: int) -> dict[str, Any]:
    cfg = BusConfig(url=url, namespace=f"benchck{os.urandom(3).hex()}")
    log = await EventLog.connect(cfg, name="bench-coordinator")
    plogs = [await EventLog.connect(cfg, name=f"bench-{name}") for name, _, _ in _PARTS]
    parts = [
        await Participant(pl, component=comp, instance=name, mode=mode).start()  # type: ignore[arg-type]
        for pl, (name, comp, mode) in zip(plogs, _PARTS, strict=True)
    ]
    tokens = LocalTokenStore(root / "tokens")
    ledger = Ledger(root / "ledger")
    try:
        rids = [f"r{i:06d}" for i in range(n)]
        for rid in rids:
            await log.dispatch(rid, {"task": rid}, instance="collector-0")

        async def one_turn(ids: list[str], t: int) -> None:
            evs = []
            for rid in ids:
                rc = tokens.put(
                    f"{rid}-c{t}", TokenRecord(prompt_ids=list(range(32)), output_ids=list(range(16)))
                )
                evs += _turn(rid, t, rc)
            by_part = {name: [e for e in evs if e.instance == name] for name, _, _ in _PARTS}
            await asyncio.gather(*(p.log.append_many(by_part[p.instance]) for p in parts))

        for chunk in range(0, n, 1000):
            await one_turn(rids[chunk : chunk + 1000], 0)
        coord = Coordinator(log, ledger, tokens)
        t0 = time.perf_counter()
        first = await coord.checkpoint(deadline_s=120)
        first_ms = (time.perf_counter() - t0) * 1000
        await one_turn(rids[: max(1, n // 100)], 1)  # one more turn for 1% of the rollouts
        watched = (root / "nats", root / "ledger", root / "tokens")
        before = _files(*watched)
        res = await coord.checkpoint(deadline_s=120)
        files_created = len(_files(*watched) - before)
        steady = res.phases_ms
        checkpoint_ms = sum(
            steady.get(k, 0.0) for k in ("acquire", "discover", "prepare", "seal", "validate", "publish")
        )

        # baseline: the same per-participant state, as per-rollout files
        state = await replay(log, up_to=res.record.cut)
        blobs: dict[str, dict[str, bytes]] = {name: {} for name, _, _ in _PARTS}
        for rid, st in state.rollouts.items():
            a = st.current()
            if a is None:
                continue
            for name, comp, _ in _PARTS:
                blobs[name][rid] = msgspec.msgpack.encode(a.sessions.get(comp))
        base_root = root / "baseline"
        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(_PARTS)) as pool:
            counts = list(pool.map(lambda kv: _baseline_participant(base_root, kv[0], kv[1]), blobs.items()))
        _write_durable(base_root / "manifest.json", msgspec.json.encode({"participants": list(blobs)}))
        baseline_ms = (time.perf_counter() - t0) * 1000
        baseline_files = sum(counts) + 1
    finally:
        for p in parts:
            await p.stop()
        for pl in plogs:
            await pl.close()
        await log.close()
        ledger.close()
        tokens.close()
    return {
        "rollouts": n,
        "participants": len(parts),
        "events": res.record.cut,
        "checkpoint_ms": round(checkpoint_ms, 1),
        "first_checkpoint_ms": round(first_ms, 1),
        "validated_events_first": first.validated_events,
        "validated_events": res.validated_events,
        "phases_ms": {k: v for k, v in steady.items() if ":" not in k},
        "files_created": files_created,
        "baseline_checkpoint_ms": round(baseline_ms, 1),
        "baseline_files_created": baseline_files,
        "speedup": round(baseline_ms / checkpoint_ms, 1),
    }
