"""Issue 35: a collection seen from the outside, with the tools operators already run.

- ``/metrics`` of a server with two workers, after N calls through the
  official openai SDK, parses with prometheus_client's own parser and counts
  exactly N, whichever worker answers the scrape.
- A running collection on a stack with two workers per server: ``rollcut
  top --once --json`` shows it; every metric the Grafana dashboard queries
  is exposed by a live server or the collector; the collector's counters
  agree with what its run says at the end.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rollcut.bus import EventLog
from rollcut.collect import METRICS_FILE
from rollcut.gym.wire import Identity, identity_headers
from rollcut.testing import ServerProcess

from .conftest import deploy, finish

pytestmark = pytest.mark.slow

DASHBOARD = Path(__file__).resolve().parents[2] / "docker" / "grafana" / "dashboards" / "rollcut.json"


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition, by name and labels (the library's parser: a malformed
    exposition raises)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _total(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


async def test_metrics_of_a_two_worker_model_server_count_every_call_exactly_once(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess]
) -> None:
    argv = ["model", "--url", nats_url, "--namespace", namespace, "--tokens", str(tmp_path / "tokens")]
    srv = ServerProcess([*argv, "--workers", "2"], workers=2, logs=tmp_path).start()
    servers.append(srv)
    calls = 12
    ids = [f"m{i}" for i in range(calls)]
    for rid in ids:
        await log.dispatch(rid, {"t": rid}, instance="collector")

    async def call(rid: str) -> int:
        # a client per call: a fresh connection, so the kernel spreads them over both workers
        async with openai.AsyncOpenAI(
            base_url=f"{srv.url}/v1",
            api_key="unused",
            default_headers=identity_headers(Identity(rid, 1)),
        ) as client:
            done = await client.chat.completions.create(
                model="rollcut-local", messages=[{"role": "user", "content": f"count for {rid}"}]
            )
        assert done.usage is not None
        return done.usage.completion_tokens

    tokens = sum(await asyncio.gather(*(call(rid) for rid in ids)))
    answered_by = set()
    for _ in range(6):  # fresh connections: the scrapes are answered by both workers in turn
        async with httpx.AsyncClient() as fresh:
            resp = await fresh.get(f"{srv.url}/metrics")
            stats = (await fresh.get(f"{srv.url}/rollcut/stats")).json()
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
        assert "# TYPE rollcut_model_calls_total counter" in resp.text
        samples = _samples(resp.text)
        assert _total(samples, "rollcut_model_calls_admitted_total", model_name="rollcut-local") == calls
        assert _total(samples, "rollcut_model_calls_total", disposition="generated") == calls
        assert _total(samples, "rollcut_model_calls_total", disposition="served_from_log") == 0
        assert _total(samples, "rollcut_model_tokens_total", kind="generated") == tokens
        assert _total(samples, "rollcut_model_custody_seconds_count") == calls
        # /rollcut/stats is read from the same counters: each worker's own, summed
        assert stats["calls_generated"] == calls and stats["tokens_generated"] == tokens
        answered_by.update(w["instance"] for w in stats["workers"])
        per_worker = [w["calls_generated"] for w in stats["workers"]]
        assert len(per_worker) == 2 and all(n > 0 for n in per_worker), per_worker  # both did work
    assert answered_by == {"model-w0", "model-w1"}


def _dashboard_metrics() -> set[str]:
    """Every metric name a query of the dashboard names (histogram queries name ``_bucket``)."""
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"]]
    names = {n for e in exprs for n in re.findall(r"\b(rollcut_[a-z0-9_]+)", e)}
    assert len(names) >= 15, names
    return names


def _top(config: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "rollcut", "top", str(config), "--once", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def test_a_running_collection_is_seen_by_top_and_every_dashboard_query_names_a_live_metric(
    tmp_path: Path,
) -> None:
    with deploy(tmp_path, workers=2, token_delay=0.02, logs=tmp_path / "logs") as dep:
        dep.every_s = 1.0
        dep._write_config()
        proc = dep.collect("--metrics-port", "0")
        try:
            dep.wait_rows(3, proc)
            metrics_file = dep.root / METRICS_FILE
            assert metrics_file.stat().st_mode & 0o777 == 0o600
            url = json.loads(metrics_file.read_text())["url"]
            give_up = time.monotonic() + 60
            while (seen := _top(dep.config))["checkpoints"]["published"] < 1:  # bounded: fails after 60 s
                assert proc.poll() is None and time.monotonic() < give_up, seen
            assert seen["collector"] == url and seen["rollouts"]["total"] == dep.rollouts
            assert seen["rollouts"]["written"] >= 3 and seen["bus"] == {"up": True, "outage": None}
            assert seen["lease_held"] is True and seen["checkpoints"]["last"]
            assert seen["checkpoints"]["last_pause_ms"] is not None and seen["checkpoints"]["per_minute"] > 0
            env = seen["servers"][0]
            assert env["url"] == dep.stack[-1].url and env["healthy"]
            assert [w["up"] for w in env["workers"]] == [True, True]  # the environment's two workers

            exposed: set[str] = set()
            for base in [url, *(p.url for p in dep.stack)]:
                text = httpx.get(f"{base}/metrics", timeout=10).text
                exposed |= {name for name, _ in _samples(text)}
            missing = _dashboard_metrics() - exposed
            assert not missing, f"the dashboard queries metrics nothing exposes: {sorted(missing)}"
            code, summary = finish(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert code == 0, summary
        assert summary["results_written"] == dep.rollouts == len(dep.rows())
        assert not metrics_file.exists()  # removed when the collection ended
