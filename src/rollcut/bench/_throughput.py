"""``bench e2e --no-crash``: what custody costs a whole collection, against the same stack without it.

Each repeat runs the demo's workload once per way, the ways' order alternating
between repeats (a drift of the machine falls on both):

- ``rollcut``: the demo's collection without a crash (custody, checkpoints every
  ``checkpoint_every_s``, the collector writing rows from the log);
- ``plain``: the same servers, tasks, agent loop and concurrency without custody
  (:mod:`._plain_stack`): what a framework without partial-rollout checkpointing runs.

The figure is the rows per second of the collection itself (from its start to
its last row, not the servers' start), and ``vs_plain``: rollcut's rate over
plain's, taken per repeat, then spread (median, min, max).
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

from ..demo import ENGINE_TASK_PARAMS, demo_rows, run_demo
from ..demo._generated import local_options
from ..testing import start_stack
from ._plain_stack import collect_plain, plain_server
from ._spread import spread

__all__ = ["PLAIN", "bench_throughput", "run_plain"]

PLAIN = "plain"
"""The way without custody (``bench e2e --way plain``)."""


async def run_plain(
    *,
    rollouts: int,
    seed: int,
    envs: tuple[str, ...],
    workers: int | None,
    concurrency: int,
    engine: str | None,
    paced: bool = False,
) -> dict[str, Any]:
    """The demo's workload collected by the plain stack: rows written, seconds, rows per second.
    ``paced``: its local model decodes at the pace rollcut's does (the same options)."""
    with tempfile.TemporaryDirectory(prefix="rollcut-plain-") as tmp, contextlib.ExitStack() as up:
        root = Path(tmp)
        model: dict[str, Any] = {"backend_options": local_options(None, paced)} if paced else {}
        if engine is not None:
            from ..gym.model.engine import served_engine

            local = up.enter_context(served_engine("tiny", root / "engine", threads=1))
            model = {"backend": "engine", "upstream": local.url, "backend_options": {"dialect": engine}}
        stack = start_stack(
            "",  # no bus, no credentials
            None,
            root / "tokens",
            namespace="plain",
            seed=seed,
            workers=workers,
            envs=envs,
            model_options=model,
            launcher=plain_server,
            environment=False,
        )
        try:
            run = await collect_plain(
                stack[-1].url,
                demo_rows(rollouts, seed, envs, params=ENGINE_TASK_PARAMS if engine else None),
                concurrency=min(rollouts, concurrency),
                output=root / "rows" / "rollouts.jsonl",
            )
        finally:
            for p in stack:
                p.close()
    rate = round(run.rows_per_s, 2)
    return {"results_written": run.written, "collect_s": run.collect_s, "rows_per_s": rate}


def _rate(run: dict[str, Any]) -> float:
    return float(run["results_written"]) / float(run["collect_s"]) if run["collect_s"] else 0.0


_ROLLCUT_FIELDS = ("rows_per_s", "collect_s", "checkpoint_pause_ms_p50", "checkpoint_pause_ms_p99")


async def bench_throughput(common: dict[str, Any], ways: tuple[str, ...], repeat: int) -> dict[str, Any]:
    """Each of ``ways`` (``rollcut``, ``plain``) ``repeat`` times on ``common`` (:func:`run_demo`'s
    arguments), without a crash; each way's figures spread, and ``vs_plain`` with both."""
    runs: dict[str, list[dict[str, Any]]] = {w: [] for w in ("rollcut", PLAIN) if w in ways}
    for r in range(repeat):
        for way in list(runs) if r % 2 == 0 else list(reversed(runs)):
            if way == PLAIN:
                keys = ("rollouts", "seed", "envs", "concurrency", "engine", "paced")
                one = await run_plain(**{k: common[k] for k in keys}, workers=common["workers"][0])
            else:
                one = await run_demo(**{**common, "crash": False})
            runs[way].append(one)
    out: dict[str, Any] = {"repeat": repeat}
    for way, got in runs.items():
        fields = ("rows_per_s", "collect_s") if way == PLAIN else _ROLLCUT_FIELDS
        out[way] = {
            "results_written": [g["results_written"] for g in got],
            **{f: spread([float(g[f] or 0.0) for g in got], 2) for f in fields},
        }
        if way == "rollcut":
            out[way]["checkpoints_published"] = [g["checkpoints_published"] for g in got]
    if len(runs) == 2:
        pairs = zip(runs["rollcut"], runs[PLAIN], strict=True)
        # from the rows and seconds, not the printed rates: a paced run's 0.42 rows/s is rounded by 1 %
        ratios = [_rate(rc) / _rate(pl) for rc, pl in pairs]
        out["vs_plain"] = spread(ratios)
    return out
