"""The collection config: YAML, validated into versioned structs with clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta

from .._errors import ConfigError

__all__ = [
    "MAX_CONCURRENCY",
    "NO_COMPACTION",
    "CheckpointPolicy",
    "CollectConfig",
    "CollectOptions",
    "CompactionPolicy",
    "load_config",
]

MAX_CONCURRENCY = 10_000
"""The most rollouts one collector runs at once. Each holds a task, a connection and a few KB of
state; past this a typo (``concurrency: 100000000``) would grow one process without bound, so it is
refused at load instead (run several collectors, one per namespace, for more)."""

_DAY = 86_400.0
Seconds = Annotated[float, Meta(gt=0, le=_DAY)]


class CheckpointPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """When a collection checkpoints: every S seconds, on SIGUSR1, on SIGTERM."""

    every_s: Seconds | None = None
    on_sigusr1: bool = True
    on_sigterm: bool = True
    deadline_s: Seconds = 30.0


class CompactionPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the stream keeps: after each periodic checkpoint, the event history of rollouts accepted
    below the oldest of the ``keep`` newest checkpoints is compacted away (docs/cluster.md).
    ``NO_COMPACTION`` keeps everything (a program that reads the history after its collection)."""

    enabled: bool = True
    keep: Annotated[int, Meta(ge=1, le=1000)] = 2
    release_tokens: bool = True
    """The compacted rollouts' token records go too (their rows are the hand-off; each keeps a digest
    of its arrays, which ``rollcut export`` checks a row against). ``false`` keeps every record: an
    opaque agent's rows name receipts only, and are exported from the store's records."""


Repeats = Annotated[int, Meta(ge=1, le=10_000)]


class CollectOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a collection runs: where its rows go to be run, how many at once and how often, when it
    checkpoints and what the stream keeps. The :class:`~rollcut.collect.Collector`'s options, declared
    once: a config file is these plus where things are (:class:`CollectConfig`), and a program builds
    them itself."""

    environment_url: str  # the environment server's /run (every row's, unless `agents` routes it)
    # agent_ref.name -> the environment server running that agent (NeMo Gym's routing by agent_ref)
    agents: dict[str, str] = {}
    # an int, or per agent_ref.name with "_default" as the fallback (NeMo Gym's two forms)
    num_repeats: Repeats | dict[str, Repeats] = 1
    concurrency: Annotated[int, Meta(ge=1, le=MAX_CONCURRENCY)] = 16
    max_attempts: Annotated[int, Meta(ge=1, le=1000)] = 5
    # how long a run that broke off waits for the environment to answer again
    heal_timeout_s: Seconds = 120.0
    # how long the bus may not answer before the collection stops for a requeue (exit 75); default:
    # the checkpoint deadline, at least 30 s (collect/_buswatch.py)
    bus_outage_s: Seconds | None = None
    checkpoint: CheckpointPolicy = CheckpointPolicy()
    compaction: CompactionPolicy = CompactionPolicy()


class CollectConfig(CollectOptions, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything a collection run needs (its options, and where things are); paths are relative to
    the config file."""

    schema_version: int = 1
    nats_url: str | None = None  # None: the embedded server under home; a cluster: its URLs, comma-separated
    replicas: Annotated[int, Meta(ge=1, le=5)] = 1  # copies of the stream when it is created (3 on a cluster)
    namespace: str = "default"
    credentials: str | None = None
    home: str = ".rollcut"
    ledger: str | None = None  # default: <home>/ledger
    tokens: str | None = None  # default: <home>/tokens
    tasks: str  # JSONL, one task per line, each with an "id"
    output: str  # JSONL of results, one row per rollout, exactly once

    def path(self, value: str, base: Path) -> Path:
        p = Path(value)
        return p if p.is_absolute() else base / p


def load_config(path: Path) -> tuple[CollectConfig, Path]:
    """The config and the directory its relative paths are relative to."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    try:
        cfg = msgspec.yaml.decode(raw, type=CollectConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if cfg.schema_version != 1:
        raise ConfigError(f"{path}: schema_version {cfg.schema_version} is not supported (1 is)")
    return cfg, path.parent.resolve()


NO_COMPACTION = CompactionPolicy(enabled=False)
"""The stream keeps every rollout's history (and every token record)."""
