"""The collector's /metrics is its own state at the scrape: what the summary counts, the scrape shows."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rollcut.bus import EventLog
from rollcut.collect import CollectOptions, Collector
from rollcut.ledger import Ledger
from rollcut.tokens import LocalTokenStore


async def test_the_faults_a_collection_absorbed_are_on_its_metrics_by_kind(
    log: EventLog, tmp_path: Path
) -> None:
    """A run that broke off on an engine's transport reset costs its rollout an attempt: counted by
    kind on the scrape (``rollcut_collect_faults_total``), as in the summary, whatever then became
    of the rollout."""
    ledger, tokens = Ledger(tmp_path / "ledger"), LocalTokenStore(tmp_path / "tokens")
    try:
        col = Collector(
            log,
            ledger,
            tokens,
            CollectOptions(environment_url="http://127.0.0.1:9"),
            tasks=[],
            output=tmp_path / "rows.jsonl",
        )
        col.summary.faults.update({"engine_error": 2, "environment_unreachable": 1})
        families = text_string_to_metric_families(generate_latest(col.metrics.registry).decode())
        faults = {
            s.labels["kind"]: s.value
            for f in families
            if f.name == "rollcut_collect_faults"
            for s in f.samples
            if s.name == "rollcut_collect_faults_total"
        }
    finally:
        tokens.close()
        ledger.close()
    assert faults == {"engine_error": 2.0, "environment_unreachable": 1.0}
