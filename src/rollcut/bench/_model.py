"""``rollcut bench model``: what durable custody adds to a model call.

``direct``: the local backend called in-process: plan and emit every token,
no HTTP, no custody. ``custody``: the same requests through the model server
process over HTTP, with the admitted event, the token-store write and the
completed event before the reply. Both with zero per-token delay, sequential
calls, so the difference is the custody and transport cost itself.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from .._telemetry import percentile
from ..bus import BusConfig, EmbeddedServer, EventLog
from ..gym.model import LocalBackend

__all__ = ["bench_model"]


async def bench_model(*, calls: int = 1000) -> dict[str, Any]:
    """Latency that durable custody adds to a model call."""
    bodies = [
        {"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 64} for i in range(calls)
    ]
    backend = LocalBackend(seed=0)
    direct: list[float] = []
    for body in bodies:
        t0 = time.perf_counter()
        plan = backend.plan(body)
        async for _ in backend.generate(plan):
            pass
        direct.append((time.perf_counter() - t0) * 1000)

    with tempfile.TemporaryDirectory(prefix="rollcut-benchmodel-") as tmp:
        root = Path(tmp)
        with EmbeddedServer(root / "nats") as nats:
            log = await EventLog.connect(BusConfig(url=nats.url, namespace="benchmodel"))
            proc = subprocess.Popen(  # noqa: ASYNC220 - started once, before timing
                [
                    sys.executable,
                    "-m",
                    "rollcut",
                    "serve",
                    "model",
                    "--url",
                    nats.url,
                    "--namespace",
                    "benchmodel",
                    "--tokens",
                    str(root / "tokens"),
                    "--port",
                    "0",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                url = ""
                while True:
                    line = proc.stdout.readline().strip()  # type: ignore[union-attr]
                    if not line:
                        raise RuntimeError("model server did not start")
                    if line.startswith("LISTENING"):
                        url = line.split()[1]
                    if line.startswith("READY"):
                        break
                custody: list[float] = []
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                    for i, body in enumerate(bodies):
                        rid = f"b{i}"
                        await log.dispatch(rid, body, instance="bench")
                        headers = {"x-rollout-id": rid, "x-rollout-attempt": "1"}
                        t0 = time.perf_counter()
                        resp = await client.post("/v1/chat/completions", json=body, headers=headers)
                        custody.append((time.perf_counter() - t0) * 1000)
                        resp.raise_for_status()
                    stats = (await client.get("/rollcut/stats")).json()
            finally:
                proc.terminate()
                proc.wait(10)
                await log.close()
    out: dict[str, Any] = {
        "calls": calls,
        "direct_p50_ms": percentile(direct, 50, 3),
        "direct_p99_ms": percentile(direct, 99, 3),
        "custody_p50_ms": percentile(custody, 50, 3),
        "custody_p99_ms": percentile(custody, 99, 3),
    }
    out["added_p50_ms"] = round(out["custody_p50_ms"] - out["direct_p50_ms"], 3)
    out["added_p99_ms"] = round(out["custody_p99_ms"] - out["direct_p99_ms"], 3)
    out.update(
        {
            k: stats[k]
            for k in ("calls_generated", "calls_served_from_log", "tokens_generated", "tokens_reused")
        }
    )
    return out
