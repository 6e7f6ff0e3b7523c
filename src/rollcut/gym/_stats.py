"""Every Gym server's counters, by stat name: which metric family and labels each one is.

One table per component, in one place, so ``docs/observability.md`` and the
dashboard have one list to follow. A stat's name is what ``/rollcut/stats``
has always shown (readers of it keep working); its metric is what
``/metrics`` shows. Families are named ``rollcut_<what>`` (``_total`` added
to counters by the library, ``_seconds``/``_bytes`` in the name).
"""

from __future__ import annotations

from .._metrics import Stat, Tally

__all__ = [
    "AGENT_STATS",
    "ENGINE_STATS",
    "ENVIRONMENT_STATS",
    "LAUNCHER_STATS",
    "MODEL_STATS",
    "RELAY_STATS",
    "RESOURCES_STATS",
    "tally",
]


def _by(family: str, doc: str, label: str, values: dict[str, str]) -> dict[str, Stat]:
    """Several stats that are one family, told apart by one label: ``{stat name: label value}``."""
    return {key: Stat(family, doc, ((label, value),)) for key, value in values.items()}


MODEL_STATS: dict[str, Stat] = {
    "calls_admitted": Stat("rollcut_model_calls_admitted", "Model calls that reached the model server"),
    **_by(
        "rollcut_model_calls",
        "Model calls by how they were answered",
        "disposition",
        {
            "calls_generated": "generated",
            "calls_served_from_log": "served_from_log",
            "calls_continued": "continued",
            "calls_joined": "joined",
            "calls_failed": "failed",
            "calls_stopped_by_retirement": "retired",
        },
    ),
    "prefix_cuts": Stat("rollcut_model_calls_cut", "Model calls cut mid-generation at a checkpoint"),
    "cuts_ahead": Stat(
        "rollcut_model_calls_cut_ahead",
        "Of those, cut ahead of a prepare due, outside the checkpoint's pause",
    ),
    "prefixes_refused": Stat(
        "rollcut_model_prefixes_refused",
        "Cut prefixes the backend would not continue (not shown to be the call's): it started over",
    ),
    "calls_regenerated": Stat(
        "rollcut_model_calls_regenerated",
        "Generated calls an earlier attempt of the rollout had made and lost (no cut kept any of it)",
    ),
    "tokens_regenerated": Stat(
        "rollcut_model_tokens_regenerated", "Output tokens of regenerated calls: the work a crash cost"
    ),
    **_by(
        "rollcut_model_tokens",
        "Output tokens by where they came from",
        "kind",
        {"tokens_generated": "generated", "tokens_reused": "kept"},
    ),
    "custody": Stat(
        "rollcut_model_custody_seconds",
        "From a call's last token to its record durable and its completion on the bus",
        histogram=True,
    ),
}
ENGINE_STATS: dict[str, Stat] = {
    "engine_requests": Stat("rollcut_engine_requests", "Requests sent to the inference engine"),
    "engine_aborts": Stat("rollcut_engine_aborts", "Engine requests aborted (cut at a checkpoint)"),
    "engine_tokens_discarded": Stat("rollcut_engine_tokens_discarded", "Engine tokens past a cut, dropped"),
    "engine_handovers": Stat("rollcut_engine_handovers", "Calls that went on with an engine that came back"),
    "engine_requests_straddled": Stat(
        "rollcut_engine_requests_straddled", "Engine answers discarded: the weights changed meanwhile"
    ),
}
RESOURCES_STATS: dict[str, Stat] = {
    **_by(
        "rollcut_tool_calls",
        "Tool calls by how they were answered",
        "source",
        {"tool_calls_executed": "executed", "tool_calls_served_from_log": "served_from_log"},
    ),
    **_by(
        "rollcut_sessions",
        "Resources sessions restored from a cut or retired",
        "event",
        {
            "sessions_restored": "restored",
            "sessions_retired": "retired",
            "sessions_superseded": "superseded",
        },
    ),
    **_by(
        "rollcut_verifications",
        "Rollouts verified: rewards computed, or a continued attempt's given again from the journal",
        "source",
        {"verifications": "computed", "verifications_served_from_log": "served_from_log"},
    ),
    **_by(
        "rollcut_sandbox_snapshots",
        "Sessions at a checkpoint: snapshotted, or refused (their rollout quarantined)",
        "outcome",
        {"snapshots": "stored", "snapshots_refused": "refused"},
    ),
}
AGENT_STATS: dict[str, Stat] = {
    **_by(
        "rollcut_agent_runs",
        "Agent runs by what happened to them",
        "event",
        {
            "runs_started": "started",
            "runs_finished": "finished",
            "runs_continued": "continued",
            "runs_retired": "retired",
            "fresh_dispatch": "fresh_dispatch",
        },
    ),
    "boundaries": Stat("rollcut_agent_boundaries", "Agent steps recorded (turn boundaries)"),
    "parks": Stat("rollcut_agent_parks", "Times the agent's runs were parked for a checkpoint"),
    "admission_waits": Stat("rollcut_agent_admission_waits", "Steps that waited for a checkpoint to end"),
}
ENVIRONMENT_STATS: dict[str, Stat] = _by(
    "rollcut_environment_episodes",
    "Episodes the environment server ran",
    "event",
    {"episodes": "started", "completed": "completed"},
)
RELAY_STATS: dict[str, Stat] = {
    **_by(
        "rollcut_relay_exchanges",
        "An opaque agent's requests through the relay",
        "outcome",
        {"exchanges_live": "live", "exchanges_replayed": "replayed", "live_held_for_checkpoint": "held"},
    ),
    "divergences": Stat("rollcut_relay_divergences", "Replayed requests that differed from the journal"),
    "journaled_bytes": Stat("rollcut_relay_journaled_bytes", "Bytes of exchanges journaled"),
    "oversize": Stat("rollcut_relay_oversize", "Exchanges too large to journal"),
}
LAUNCHER_STATS: dict[str, Stat] = {
    **_by(
        "rollcut_opaque_runs",
        "Opaque agent runs by what happened to them",
        "event",
        {
            "runs_started": "started",
            "runs_finished": "finished",
            "runs_replayed": "replayed",
            "fresh_dispatch": "fresh_dispatch",
            "runs_failed": "failed",
            "runs_retired": "retired",
            "runs_timed_out": "timed_out",
        },
    ),
    "agent_restarts": Stat("rollcut_opaque_agent_restarts", "Agent programs started again"),
    **_by(
        "rollcut_opaque_sandboxes",
        "Opaque agents' sandboxes by event",
        "event",
        {
            "sandboxes_snapshotted": "snapshotted",
            "sandboxes_restored": "restored",
            "sandbox_snapshots_failed": "snapshot_failed",
        },
    ),
}


def tally(stats: dict[str, Stat], model_name: str | None = None) -> Tally:
    """A component's tally; ``model_name`` labels every series when the component serves a model."""
    return Tally(stats, {"model_name": model_name} if model_name else {})
