"""``rollcut bench model``: what durable custody costs a model server, under concurrent clients.

Two server processes on the same machine, in the same run: the model server
(``rollcut serve model``: the admitted event, the token-store write and the
completed event before each reply) and the same server without custody
(the plain stack's model server, ``_plain_serve``: the same options, FastAPI app,
uvicorn, backend and response shapes, nothing recorded). Both with the local
backend and zero per-token delay, so the difference is custody and nothing else. Each is driven by 1, 8 and 64
concurrent clients (keep-alive connections), in alternating order, ``repeat``
times. By default every call is its own rollout: the worst case, as the server
reads a rollout's fence and context on its first call. With ``turns`` each
rollout makes that many calls one after another, as a multi-turn agent does, so
those first-call reads are shared by its turns.

With ``tracing``, a third server joins the rotation: the same model server
exporting its spans (OTLP/HTTP, batched, every span sampled) to a receiver
in this process that reads and discards them: the cost of tracing on is its
ratio to the model server without (``tracing_ratio``, ``tracing_added_*``).

Per client count: calls/s of each, their ratio (custody over plain) per
repeat, and the latency custody adds at p50 and p99 (medians over repeats,
with spreads). Beside them the CPU each server process spent per call and the
CPU the load generator spent per call (all on the same cores, so a ratio of
throughputs is also a ratio of who got the cores; the CPU per call is not).
Read from ``/proc`` (Linux); elsewhere these fields are absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from .._process import lifeline
from .._telemetry import percentile
from ..bus import BusConfig, EmbeddedServer, EventLog, ModelCallCompleted
from ..gym import ModelServe, encode_spec
from ._spread import spread

__all__ = ["bench_model"]


def _spawn(argv: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, preexec_fn=lifeline(), env=env)
    url = ""
    while True:
        line = proc.stdout.readline().strip()  # type: ignore[union-attr]
        if not line:
            proc.kill()
            raise RuntimeError(f"{' '.join(argv[:5])} did not start")
        if line.startswith("LISTENING"):
            url = line.split()[1]
        if line.startswith("READY"):
            return proc, url


async def _load(
    url: str, rollouts: list[tuple[str, list[dict[str, Any]]]], clients: int
) -> tuple[list[float], float]:
    """Every rollout's calls once, in order, ``clients`` rollouts at a time: each call's latency (ms)
    and the wall time (s).

    Each client has its own connection and its own httpx client: one client shared by 64
    concurrent callers spends its time in its own pool (measured: both servers then answer about
    110 calls/s with p99 2.7 s), which would hide the servers being compared."""
    lat: list[float] = []
    todo = iter(rollouts)

    async def client() -> None:
        async with httpx.AsyncClient(
            base_url=url, timeout=120, limits=httpx.Limits(max_connections=1)
        ) as http:
            await http.get("/healthz")  # connected before the clock starts
            ready.append(1)
            if len(ready) == clients:
                all_ready.set()
            await started.wait()
            for rid, bodies in todo:
                headers = {"x-rollout-id": rid, "x-rollout-attempt": "1"}
                for body in bodies:
                    t0 = time.perf_counter()
                    resp = await http.post("/v1/chat/completions", json=body, headers=headers)
                    lat.append((time.perf_counter() - t0) * 1000)
                    if resp.status_code != 200:  # a benchmark of failures measures nothing: stop, say why
                        raise RuntimeError(f"{url} answered {resp.status_code}: {resp.text[:300]}")

    started, all_ready = asyncio.Event(), asyncio.Event()
    ready: list[int] = []
    running = [asyncio.ensure_future(client()) for _ in range(clients)]
    await all_ready.wait()
    t0 = time.perf_counter()
    started.set()
    await asyncio.gather(*running)
    return lat, time.perf_counter() - t0


def _rollouts(run: int, calls: int, turns: int) -> list[tuple[str, list[dict[str, Any]]]]:
    """``calls`` requests of run ``run`` as rollouts of ``turns`` calls each (the last may have
    fewer); each turn's request is new, so no call is a retry of another."""
    out: list[tuple[str, list[dict[str, Any]]]] = []
    for first in range(0, calls, turns):
        rid = f"m{run}-{first}"
        bodies = [
            {"messages": [{"role": "user", "content": f"q{run}-{first} turn {t}"}], "max_tokens": 64}
            for t in range(min(turns, calls - first))
        ]
        out.append((rid, bodies))
    return out


async def _chained(log: EventLog) -> int:
    """Completed calls the log shows as a later turn of their rollout (their parent call named)."""
    n = 0
    async for page in log.read_pages(component="model"):
        n += sum(isinstance(s.event, ModelCallCompleted) and s.event.parent_call_id is not None for s in page)
    return n


def _cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) a process has used so far; None where /proc is not."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rates(runs: list[Any]) -> list[float]:
    """Calls per second of each run (its latencies, its wall time)."""
    return [len(lat) / wall for lat, wall in runs]


def _against(runs: list[Any], base: list[Any], ratio: str, added: str) -> dict[str, Any]:
    """One server against another, run by run of the same rotation: the throughput ratio and the
    latency it adds at p50 and p99 (medians over repeats, with spreads)."""

    def more(p: int) -> list[float]:
        return [
            (percentile(a, p, 3) or 0.0) - (percentile(b, p, 3) or 0.0)
            for (a, _), (b, _) in zip(runs, base, strict=True)
        ]

    ratios = [a / b for a, b in zip(_rates(runs), _rates(base), strict=True)]
    return {
        ratio: spread(ratios),
        f"{added}_p50_ms": spread(more(50)),
        f"{added}_p99_ms": spread(more(99)),
    }


class _Sink(ThreadingHTTPServer):
    """An OTLP/HTTP endpoint that reads every export and answers 200 (an empty
    ``ExportTraceServiceResponse`` is zero bytes): what a collector costs the exporter, and no more."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the standard library names it
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


async def bench_model(
    *,
    calls: int = 600,
    clients: tuple[int, ...] = (1, 8, 64),
    repeat: int = 3,
    tracing: bool = False,
    turns: int = 1,
) -> dict[str, Any]:
    """Throughput and latency of the model server with custody against the same server without (and,
    with ``tracing``, against the model server exporting spans); ``turns`` calls per rollout."""
    with tempfile.TemporaryDirectory(prefix="rollcut-benchmodel-") as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        with EmbeddedServer(root / "nats") as nats:
            ns = f"benchmodel{os.urandom(3).hex()}"
            log = await EventLog.connect(BusConfig(url=nats.url, namespace=ns))
            serve = ["serve", "model", "--url", nats.url, "--namespace", ns, "--tokens", str(root / "tokens")]
            custody, custody_url = _spawn([sys.executable, "-m", "rollcut", *serve, "--port", "0"])
            # the baseline from the same options, through the plain stack's own launcher
            spec = encode_spec(ModelServe(url=nats.url, namespace=ns, tokens=str(root / "tokens")))
            plain, plain_url = _spawn(
                [sys.executable, "-m", "rollcut.bench._plain_serve", "model", "--spec", spec]
            )
            urls = {"plain": plain_url, "custody": custody_url}
            pids = {"plain": plain.pid, "custody": custody.pid}
            procs = [custody, plain]
            if tracing:
                sink = _Sink()
                stack.callback(sink.shutdown)
                env = {
                    **os.environ,
                    "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url,
                    "OTEL_TRACES_SAMPLER": "always_on",
                }
                traced, urls["traced"] = _spawn([sys.executable, "-m", "rollcut", *serve, "--port", "0"], env)
                pids["traced"] = traced.pid
                procs.append(traced)
            cpu: dict[int, dict[str, list[tuple[float, float]]]] = {}
            runs: dict[int, dict[str, list[Any]]] = {}
            try:
                run = 0
                for c in clients:
                    got = runs.setdefault(c, {name: [] for name in urls})
                    names = list(urls)
                    for r in range(repeat):
                        order = names[r % len(names) :] + names[: r % len(names)]  # each goes first in turn
                        for name in order:
                            run += 1
                            rollouts = _rollouts(run, calls, turns)
                            if name != "plain":
                                for rid, bodies in rollouts:
                                    await log.dispatch(rid, bodies[0], instance="bench")
                            server0, client0 = _cpu_s(pids[name]), time.process_time()
                            got[name].append(await _load(urls[name], rollouts, c))
                            server1, client1 = _cpu_s(pids[name]), time.process_time()
                            if server0 is not None and server1 is not None:
                                used = ((server1 - server0) / calls * 1e6, (client1 - client0) / calls * 1e6)
                                cpu.setdefault(c, {}).setdefault(name, []).append(used)
                async with httpx.AsyncClient() as http:
                    stats = (await http.get(f"{custody_url}/rollcut/stats")).json()
                chained = await _chained(log)
            finally:
                for proc in procs:
                    proc.terminate()
                    proc.wait(10)
                await log.close()
    out: dict[str, Any] = {"calls": calls, "turns": turns, "repeat": repeat, "clients": {}}
    for c, got in runs.items():
        row = out["clients"][str(c)] = {
            "plain_calls_per_s": spread(_rates(got["plain"]), 1),
            "custody_calls_per_s": spread(_rates(got["custody"]), 1),
            "plain_p50_ms": spread([percentile(lat, 50, 3) or 0.0 for lat, _ in got["plain"]]),
            "plain_p99_ms": spread([percentile(lat, 99, 3) or 0.0 for lat, _ in got["plain"]]),
            "custody_p50_ms": spread([percentile(lat, 50, 3) or 0.0 for lat, _ in got["custody"]]),
            "custody_p99_ms": spread([percentile(lat, 99, 3) or 0.0 for lat, _ in got["custody"]]),
            **_against(got["custody"], got["plain"], "throughput_ratio", "added"),
        }
        if got.get("traced"):
            row["traced_calls_per_s"] = spread(_rates(got["traced"]), 1)
            row |= _against(got["traced"], got["custody"], "tracing_ratio", "tracing_added")
        for name, spent in cpu.get(c, {}).items():
            out["clients"][str(c)][f"{name}_server_cpu_us_per_call"] = spread([u for u, _ in spent], 0)
            out["clients"][str(c)][f"{name}_client_cpu_us_per_call"] = spread([u for _, u in spent], 0)
    out.update({k: stats[k] for k in ("calls_generated", "calls_served_from_log", "tokens_generated")})
    out["calls_with_a_parent"] = chained
    return out
