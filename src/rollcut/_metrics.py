"""One server's counters as ``prometheus_client`` metrics, and their exposition across workers.

A server's counters used to be a dict per component, printed by hand on
``/metrics`` (no ``# TYPE``, and only the worker that took the connection).
Now each component keeps a :class:`Tally`: its counters are metrics in a
registry of their own (a second tally in the same process never collides),
``/rollcut/stats`` reads them back by their stat names, and ``/metrics``
exposes them in Prometheus' text format.

Several workers (``--workers K``) use the library's multiprocess mode: the
parent gives every worker the same private directory in
``PROMETHEUS_MULTIPROC_DIR`` (see :func:`multiproc_env`), each worker's
values go to files there, and whichever worker answers ``/metrics`` reads
them all, summed. A restarted worker's counts stay counted (its files stay);
a dead worker's live gauges are dropped by the parent
(:func:`worker_gone`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

__all__ = [
    "CONTENT_TYPE",
    "LATENCY_BUCKETS",
    "MULTIPROC_ENV",
    "Stat",
    "Tally",
    "exposition",
    "multiproc_env",
    "worker_gone",
]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""The library's own variable: set, every metric of the process is kept in files there."""
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Prometheus' text exposition format, as every ``/metrics`` answers."""
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
"""Seconds, from a local write (sub-millisecond) to a checkpoint that waits on a slow participant."""


@dataclass(frozen=True)
class Stat:
    """Where one stat of a component lives: a metric family and its labels' values.

    ``family`` is the name without ``_total``, which the library adds to a
    counter; the stats with one family differ by ``labels``."""

    family: str
    doc: str
    labels: tuple[tuple[str, str], ...] = ()
    histogram: bool = False


@dataclass(eq=False)
class Tally(Mapping[str, int]):
    """A component's counters: ``inc`` where something happens; read as a mapping of stat name to
    count (what ``/rollcut/stats`` shows), every read from the registry.

    ``const`` labels (``model_name``) are on every series, so the model
    server's metrics join an engine's own (``vllm:*``) on that label."""

    stats: Mapping[str, Stat]
    const: Mapping[str, str] = field(default_factory=dict)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        families: dict[str, Counter | Histogram] = {}
        self._series: dict[str, Counter | Histogram] = {}
        self._keys: dict[str, tuple[str, dict[str, str]]] = {}
        for key, stat in self.stats.items():
            labels = {**self.const, **dict(stat.labels)}
            fam = families.get(stat.family)
            if fam is None and stat.histogram:
                fam = Histogram(
                    stat.family, stat.doc, list(labels), registry=self.registry, buckets=LATENCY_BUCKETS
                )
            elif fam is None:
                fam = Counter(stat.family, stat.doc, list(labels), registry=self.registry)
            families[stat.family] = fam
            self._series[key] = fam.labels(**labels) if labels else fam
            sample = f"{stat.family}_count" if stat.histogram else f"{stat.family}_total"
            self._keys[key] = (sample, labels)

    def inc(self, key: str, n: float = 1) -> None:
        """Count ``n`` more of ``key`` (a counter only ever grows)."""
        series = self._series[key]
        assert isinstance(series, Counter)
        series.inc(n)

    def observe(self, key: str, seconds: float) -> None:
        """One more duration of ``key`` (a histogram)."""
        series = self._series[key]
        assert isinstance(series, Histogram)
        series.observe(seconds)

    def __getitem__(self, key: str) -> int:
        sample, labels = self._keys[key]
        value = self.registry.get_sample_value(sample, labels)
        return int(value or 0)

    def snapshot(self) -> dict[str, int]:
        """Every stat by name, from one pass over the registry (reading them one by one through the
        mapping would collect every family once per stat)."""
        seen = {
            (s.name, frozenset(s.labels.items())): s.value
            for fam in self.registry.collect()
            for s in fam.samples
        }
        return {
            key: int(seen.get((sample, frozenset(labels.items())), 0))
            for key, (sample, labels) in self._keys.items()
        }

    def __iter__(self) -> Iterator[str]:
        return iter(self.stats)

    def __len__(self) -> int:
        return len(self.stats)


def exposition(tallies: Iterable[Tally]) -> bytes:
    """``/metrics`` of this server: with several workers, every worker's (from the shared files),
    otherwise this process's tallies (each family is in one tally only)."""
    directory = os.environ.get(MULTIPROC_ENV)
    if directory:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
    return b"".join(generate_latest(t.registry) for t in tallies)


def multiproc_env(private_dir: str) -> dict[str, str]:
    """The environment a server's workers start with: the library's multiprocess directory, made
    inside the parent's private (0700) directory, so no other user reads or plants the files."""
    path = Path(private_dir) / "metrics"
    path.mkdir(mode=0o700, exist_ok=True)
    return {**os.environ, MULTIPROC_ENV: str(path)}


def worker_gone(env: Mapping[str, str], pid: int) -> None:
    """A worker died: its live gauges stop counting (its counters stay: what it did, it did)."""
    directory = env.get(MULTIPROC_ENV)
    if directory:
        mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]
