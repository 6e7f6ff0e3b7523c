"""``rollcut bench soak``: a long collection on a cluster with compaction, sampled over time.

What it shows: with compaction on, the stream's bytes follow the rollouts *in flight*, not the
rollouts *done*; the collector's memory stays flat. Every Gym server is a process, the cluster is
three nats-server processes with the stream at three replicas (``--cluster 1``: one server, R1),
and the collector runs here, as ``rollcut collect`` would run it. The baseline, measured in the same
run, is what the stream would hold without compaction: its bytes plus every byte compaction let go.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .._home import credentials_for
from ..bus import BusConfig, EventLog, embedded_nats
from ..collect import NO_COMPACTION, CheckpointPolicy, CollectOptions, Collector, CompactionPolicy
from ..demo import DEMO_NAMESPACE, demo_rows
from ..ledger import Ledger
from ..testing import ServerProcess, start_stack
from ..tokens import LocalTokenStore

__all__ = ["bench_soak"]


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    """Resident memory now of a process, in MB (``RssAnon``: without mapped files such as LMDB's
    pages, which the kernel reclaims as it needs); 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


def _disk_bytes(root: Path, prefix: str = "") -> int:
    """Bytes of the files under ``root`` now (under its folders named ``prefix``… only, if given); the
    server deletes emptied blocks as we walk."""
    total = 0
    for folder, _, files in os.walk(root):
        if prefix and not os.path.relpath(folder, root).startswith(prefix):
            continue
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(folder, name)).st_size
    return total


def _growth(samples: list[dict[str, Any]], field: str = "collector_anon_mb") -> float | None:
    """Growth in bytes of ``field`` (MB) per row written over the second half of the run (least
    squares): about 0 for the collector's anonymous memory when it follows the rollouts running, not
    the rollouts done. The first half fills what is bounded but not small (the bus's caches of 65,536
    subjects and open fences, the allocator's arenas)."""
    if not samples:
        return None
    late = [s for s in samples if s["rows"] >= samples[-1]["rows"] / 2]
    if len(late) < 3:
        return None
    xs = [float(s["rows"]) for s in late]
    ys = [s[field] * 2**20 for s in late]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return round(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var, 1) if var else None


async def bench_soak(
    *,
    rollouts: int = 10_000,
    cluster: int = 3,
    concurrency: int = 64,
    checkpoint_every_s: float = 2.0,
    keep: int = 2,
    sample_s: float = 10.0,
    seed: int = 0,
    instant: bool = False,
) -> dict[str, Any]:
    """Collect ``rollouts`` with compaction on, sampling stream bytes, disk and memory. ``instant``:
    through an environment that finishes every rollout at once (``bench/instant_env.py``), with
    distinct tasks streamed as the collection reads them: the collector's own costs alone."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rollcut-soak-") as tmp, contextlib.ExitStack() as up:
        root = Path(tmp)
        creds = credentials_for(root / "nats", DEMO_NAMESPACE)
        nats = embedded_nats(root / "nats", nodes=cluster, credentials=creds)
        up.enter_context(nats)
        pids = nats.pids
        replicas = min(cluster, 3)
        log = await EventLog.connect(
            BusConfig(url=nats.url, replicas=replicas).as_role(creds, "admin"), name="soak-collector"
        )
        stack = (
            [ServerProcess([], command=[sys.executable, "-m", "rollcut.bench.instant_env"]).start()]
            if instant
            else start_stack(
                nats.url,
                root / "nats" / "credentials.json",
                root / "tokens",
                namespace=DEMO_NAMESPACE,
                seed=seed,
                token_delay=0.0,
                replicas=replicas,
            )
        )
        tasks = (
            ({"id": f"t{i}", "prompt": "instant"} for i in range(rollouts))
            if instant
            else demo_rows(rollouts, seed)
        )
        samples: list[dict[str, Any]] = []
        options = CollectOptions(
            environment_url=stack[-1].url,
            concurrency=concurrency,
            checkpoint=CheckpointPolicy(every_s=checkpoint_every_s),
            compaction=CompactionPolicy(keep=keep) if keep else NO_COMPACTION,  # 0: the baseline
        )
        try:
            with Ledger(root / "ledger") as ledger, LocalTokenStore(root / "tokens") as tokens:
                col = Collector(log, ledger, tokens, options, tasks=tasks, output=root / "rollouts.jsonl")
                run = asyncio.ensure_future(col.run())
                while not run.done():
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(asyncio.shield(run), sample_s)
                    info = await log.stream_info()
                    samples.append(
                        {
                            "t_s": round(time.perf_counter() - t0, 1),
                            "rows": col.summary.results_written,
                            "stream_mb": round(info.state.bytes / 2**20, 2),
                            "stream_msgs": info.state.messages,
                            "disk_mb": round(_disk_bytes(root / "nats") / 2**20, 1),
                            "collector_rss_mb": _rss_mb(os.getpid()),
                            "collector_anon_mb": _rss_mb(os.getpid(), "RssAnon"),
                            # what moved out of the collector's memory: its index of the collection
                            "index_mb": round(_disk_bytes(root, ".rollcut-index-") / 2**20, 1),
                            "nats_rss_mb": round(sum(_rss_mb(p) for p in pids), 1),
                            "compacted": col.summary.compacted_rollouts,
                            # the token store's pages in use, and what it would hold had compaction
                            # released nothing (its records' stored bytes added back)
                            "tokens_mb": round(tokens.used_bytes() / 2**20, 2),
                            "tokens_unreleased_mb": round(
                                (tokens.used_bytes() + col.summary.compaction_released_token_bytes) / 2**20, 2
                            ),
                            # the baseline: what the stream would hold had nothing been compacted
                            "uncompacted_mb": round(
                                (info.state.bytes + col.summary.compaction_freed_bytes) / 2**20, 2
                            ),
                        }
                    )
                summary = await run
        finally:
            for p in stack:
                p.close()
            await log.close()
    return {
        "rollouts": rollouts,
        "written": summary.results_written,
        "cluster_nodes": cluster,
        "replicas": replicas,
        "concurrency": concurrency,
        "keep": keep,
        "wall_s": round(time.perf_counter() - t0, 1),
        "checkpoints_published": summary.checkpoints_published,
        "checkpoint_ms_p50_p99": [summary.checkpoint_ms_p50, summary.checkpoint_ms_p99],
        "failed": summary.failed,
        # what decides the command's exit: a soak that did not write every row is no measurement
        "unwritten": len(summary.pending) + len(summary.gave_up),
        "bus_outage": summary.bus_outage,
        "compactions_failed": summary.compactions_failed,
        "compacted_rollouts": summary.compacted_rollouts,
        "compaction_s": summary.compaction_s,
        "stream_mb_max": max((s["stream_mb"] for s in samples), default=0),
        "stream_mb_end": samples[-1]["stream_mb"] if samples else 0,
        "collector_rss_mb_first_last": [samples[0]["collector_rss_mb"], samples[-1]["collector_rss_mb"]]
        if samples
        else [],
        "collector_anon_mb_first_last": [samples[0]["collector_anon_mb"], samples[-1]["collector_anon_mb"]]
        if samples
        else [],
        "uncompacted_mb_end": samples[-1]["uncompacted_mb"] if samples else 0,
        "collector_anon_bytes_per_rollout": _growth(samples),
        "index_mb_end": samples[-1]["index_mb"] if samples else 0,
        "tokens_mb_end": samples[-1]["tokens_mb"] if samples else 0,
        "tokens_unreleased_mb_end": samples[-1]["tokens_unreleased_mb"] if samples else 0,
        "token_store_bytes_per_rollout": _growth(samples, "tokens_mb"),
        "stream_bytes_per_rollout": _growth(samples, "stream_mb"),
        "samples": samples,
    }
