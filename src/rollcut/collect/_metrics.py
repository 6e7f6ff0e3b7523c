"""The collector's metrics: read from the collection's own state when scraped, and its checkpoints'
durations as histograms.

Why read at scrape time: the collection already counts what it did (its
summary is what ``--json`` prints and what the exit code is decided on); a
second set of counters kept beside it could disagree with it. So the
counters and gauges here are that summary, the lease and the bus watch as
they are at the scrape; only the checkpoints' durations, which the summary
keeps as percentiles, are observed into histograms as each one publishes.

Served by ``rollcut collect --metrics-port`` (``/metrics``, ``/rollcut/stats``
for ``rollcut top``); every series has a ``namespace`` label, the collection's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as _Source

from .._files import write_private
from .._metrics import CONTENT_TYPE, LATENCY_BUCKETS
from .._process import http_url
from ._summary import summary_dict

if TYPE_CHECKING:
    from ..participants import CheckpointResult
    from ._collector import Collector

__all__ = ["METRICS_FILE", "CollectorMetrics", "serve_metrics"]

METRICS_FILE = "metrics.json"
"""In a collection's home while ``--metrics-port`` serves: its URL and pid, for ``rollcut top``."""

_FAILURES_SHOWN = 20


class CollectorMetrics(_Source):
    """The registry ``--metrics-port`` serves, and the collection's stats for ``rollcut top``."""

    def __init__(self, col: Collector) -> None:
        self.col = col
        self.started = time.time()
        self.last_pause_s: float | None = None
        self.last_published: float | None = None
        self.last_participants = 0
        self.registry = CollectorRegistry()
        self._duration = self._histogram(
            "rollcut_checkpoint_duration_seconds", "A published checkpoint, end to end"
        )
        self._pause = self._histogram(
            "rollcut_checkpoint_pause_seconds", "How long a published checkpoint stood the collection still"
        )
        self.registry.register(self)

    def _histogram(self, name: str, doc: str) -> Any:
        family = Histogram(name, doc, ["namespace"], registry=self.registry, buckets=LATENCY_BUCKETS)
        return family.labels(self.col.log.subjects.namespace)

    def checkpoint(self, res: CheckpointResult, seconds: float) -> None:
        """One published checkpoint: its duration, its pause, who it waited on."""
        self._duration.observe(seconds)
        self._pause.observe(res.pause_ms / 1000)
        self.last_pause_s = res.pause_ms / 1000
        self.last_published = time.time()
        self.last_participants = len(res.participants)

    def collect(self) -> Iterator[Metric]:
        col, s = self.col, self.col.summary
        ns = col.log.subjects.namespace

        def gauge(name: str, doc: str, value: float, **labels: str) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["namespace", *labels])
            g.add_metric([ns, *labels.values()], value)
            return g

        def counter(name: str, doc: str, by: str, values: dict[str, float]) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=["namespace", by])
            for key, value in values.items():
                c.add_metric([ns, key], value)
            return c

        states = self.rollout_states()
        rollouts = GaugeMetricFamily("rollcut_rollouts", "Rollouts by state", labels=["namespace", "state"])
        for state, n in states.items():
            rollouts.add_metric([ns, state], n)
        yield rollouts
        yield counter(
            "rollcut_checkpoints",
            "Checkpoints by outcome",
            "outcome",
            {"published": s.checkpoints_published, "failed": s.checkpoints_failed},
        )
        yield counter(
            "rollcut_rollouts_recovered", "Rollouts by recovery class", "recovery", dict(s.recovery)
        )
        yield counter(
            "rollcut_rollouts_handled",
            "Rollouts healed in place, restarted from their input, or retired",
            "how",
            {"healed": s.healed, "restarted": s.fallbacks_to_fresh, "retired": s.retired},
        )
        yield counter(
            "rollcut_collect_faults",
            "What the runs that broke off met, by kind (an error's kind, or environment_unreachable): "
            "each cost its rollout an attempt, recovered or not",
            "kind",
            dict(s.faults),
        )
        yield counter(
            "rollcut_compaction",
            "What compaction let go",
            "what",
            {"rollouts": s.compacted_rollouts, "blobs": s.compaction_freed_blobs},
        )
        freed = CounterMetricFamily(
            "rollcut_compaction_freed_bytes", "Stream bytes compaction let go", labels=["namespace"]
        )
        freed.add_metric([ns], s.compaction_freed_bytes)
        yield freed
        yield gauge(
            "rollcut_checkpoint_last_pause_seconds", "The newest checkpoint's pause", self.last_pause_s or 0
        )
        yield gauge(
            "rollcut_checkpoint_last_published_timestamp_seconds",
            "When the newest checkpoint published (Unix time; 0: none yet)",
            self.last_published or 0,
        )
        yield gauge(
            "rollcut_checkpoint_participants",
            "Participants the newest checkpoint waited on",
            self.last_participants,
        )
        yield gauge(
            "rollcut_collection_start_timestamp_seconds", "When this collection started", self.started
        )
        yield gauge(
            "rollcut_lease_holder",
            "1 while this collector holds the namespace's lease",
            1.0 if col.lease.seq else 0.0,
            instance=col.instance,
            collection=col.lease.collection,
        )
        yield gauge(
            "rollcut_bus_up",
            "1 while the bus answers the collector's probe (0 once it stopped for an outage)",
            0.0 if col.watch.outage else 1.0,
        )

    def rollout_states(self) -> dict[str, int]:
        """Rollouts by state: written (a row), running, failing (their last try failed, retrying),
        waiting (not started yet, or between attempts)."""
        s = self.col.summary
        total = s.rollouts
        written, running = s.results_written, self.col.running
        failing = sum(1 for k in s.failed if k in self.col.rows.inputs)
        return {
            "written": written,
            "running": running,
            "failing": failing,
            "waiting": max(0, total - written - running),
        }

    def stats(self) -> dict[str, Any]:
        """``/rollcut/stats`` of the collector: the summary as it stands, and what ``rollcut top``
        shows besides (states, the newest checkpoint, the bus, the environment)."""
        summary = summary_dict(self.col.summary)
        failed = summary.pop("failed")
        return {
            "instance": self.col.instance,
            "namespace": self.col.log.subjects.namespace,
            "environment_url": self.col.env_url,
            "started": self.started,
            "states": self.rollout_states(),
            "last_pause_s": self.last_pause_s,
            "last_published": self.last_published,
            "participants": self.last_participants,
            "bus_outage": self.col.watch.outage,
            "lease_held": bool(self.col.lease.seq),
            "failures": dict(list(failed.items())[-_FAILURES_SHOWN:]),
            "failures_total": len(failed),
            **summary,
        }


@contextlib.asynccontextmanager
async def serve_metrics(metrics: CollectorMetrics, host: str, port: int, home: Path) -> AsyncIterator[str]:
    """Serve ``/metrics`` (this collector's registry and the process's own), ``/rollcut/stats`` and
    ``/healthz`` on ``host:port`` (0: a free one) in the collection's event loop, for as long as the
    block runs; the URL goes to ``<home>/metrics.json`` (0600) for ``rollcut top``, and is removed
    after."""
    # here, not at the top: `import rollcut.collect` stays free of FastAPI (tests/gym/test_imports.py)
    from fastapi import FastAPI
    from fastapi.responses import Response

    from .._tracing import FASTAPI_TELEMETRY

    app = FastAPI(title="rollcut collector", version="1", telemetry=FASTAPI_TELEMETRY)

    @app.get("/metrics")
    async def exposition() -> Response:
        return Response(
            generate_latest(metrics.registry) + generate_latest(REGISTRY), media_type=CONTENT_TYPE
        )

    @app.get("/rollcut/stats")
    async def stats() -> dict[str, Any]:
        return metrics.stats()

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    from ..gym import bind  # the Gym servers' listening socket (TCP_NODELAY on what it accepts)

    sock = bind(host, port)
    url = http_url(host, sock.getsockname()[1])
    server = _embedded(app)
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    path = home / METRICS_FILE
    try:
        write_private(path, json.dumps({"url": url, "pid": os.getpid()}).encode())
        yield url
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        server.should_exit = True
        await serving
        sock.close()


def _embedded(app: Any) -> Any:
    """uvicorn inside the collection's loop, without taking the collection's own SIGTERM and SIGUSR1
    handling over (uvicorn's ``serve`` captures both signals while it runs)."""
    import uvicorn

    class Embedded(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Embedded(uvicorn.Config(app, log_level="warning", lifespan="off"))
