"""Issue 35: spans in the GenAI conventions reach a real OTLP/HTTP receiver, one trace per attempt
across every process, and a continued attempt's trace links to the attempt it continues.

The whole stack runs as processes configured by the standard variables only
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_SCHEDULE_DELAY``);
the collection is stopped by SIGTERM (checkpoint, exit 75) and resumed, so
the rollouts it cut continue as attempt 2.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import pytest

from ..otlp import Receiver, Span
from .conftest import SIGTERM, deploy, finish

pytestmark = pytest.mark.slow

SERVER, CLIENT, INTERNAL = 2, 3, 1  # the protobuf's SpanKind values
CHAT = {
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.response.finish_reasons",
    "rollcut.rollout_id",
    "rollcut.attempt",
}


def _wait_for(receiver: Receiver, ready: object, what: str, timeout: float = 30) -> None:
    give_up = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]  # bounded: the exporters flush every 100 ms
        assert time.monotonic() < give_up, f"no {what} arrived: {sorted({s.name for s in receiver.spans})}"
        time.sleep(0.05)


def _arrived(spans: list[Span]) -> bool:
    """A continued attempt's trace holds every process's spans, and each checkpoint's trace its
    participants' prepares."""
    services: dict[str, set[str]] = defaultdict(set)
    for s in spans:
        services[s.trace_id].add(s.service)
    continued = [s for s in spans if s.name == "invoke_agent" and s.attributes.get("rollcut.attempt") == 2]
    everyone = {"rollcut-agent", "rollcut-model", "rollcut-resources", "rollcut-environment"}
    checkpoints = [s for s in spans if s.name == "rollcut.checkpoint"]
    participants = {"rollcut-model", "rollcut-agent", "rollcut-resources"}
    return any(everyone <= services[r.trace_id] for r in continued) and all(
        participants <= services[c.trace_id] for c in checkpoints
    )


def _root(spans: list[Span], rid: str, attempt: int) -> Span | None:
    return next(
        (
            s
            for s in spans
            if s.service == "rollcut-collector"
            and s.name == "invoke_agent"
            and s.attributes.get("rollcut.rollout_id") == rid
            and s.attributes.get("rollcut.attempt") == attempt
        ),
        None,
    )


def test_one_trace_per_attempt_across_every_process_and_a_continued_attempt_links_to_its_predecessor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        with deploy(tmp_path, token_delay=0.02) as dep:
            proc = dep.collect()
            dep.wait_rows(3, proc)
            proc.send_signal(SIGTERM)
            code, summary = finish(proc)
            assert code == 75, summary
            code, summary = finish(dep.collect("--resume"))
            assert code == 0, summary
            assert summary["recovery"]["continue"] >= 1, summary
            # the collector exported as it exited; the servers, which run on, export every 100 ms
            _wait_for(
                receiver, lambda: _arrived(list(receiver.spans)), "whole continued attempt or checkpoint"
            )
        spans = list(receiver.spans)
    assert not receiver.bad

    by_trace: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        by_trace[s.trace_id].append(s)
    continued = [r for r in spans if r.name == "invoke_agent" and r.attributes.get("rollcut.attempt") == 2]
    whole = 0
    for root in continued:
        rid = root.attributes["rollcut.rollout_id"]
        trace = by_trace[root.trace_id]
        assert root.kind == CLIENT and root.parent == ""  # a trace of its own
        # every span of the trace serves this attempt, whichever process made it
        for s in trace:
            if "rollcut.rollout_id" in s.attributes:
                assert (s.attributes["rollcut.rollout_id"], s.attributes["rollcut.attempt"]) == (rid, 2), s
        services = {s.service for s in trace}
        if {"rollcut-agent", "rollcut-model", "rollcut-resources", "rollcut-environment"} <= services:
            whole += 1
        # the link: to the root span of attempt 1, which the first collector exported as it stopped
        before = _root(spans, rid, 1)
        assert before is not None, rid
        assert [(t, sid) for t, sid, _ in root.links] == [(before.trace_id, before.span_id)]
        assert root.links[0][2]["rollcut.link"] == "continues"
    assert whole >= 1, "no continued attempt's trace reached every process"

    chats = [s for s in spans if s.name.startswith("chat ")]
    # a call the SIGTERM broke off ends in error, without usage; the rest carry all of it
    served = [s for s in chats if s.service == "rollcut-model" and not s.error]
    asked = [s for s in chats if s.service == "rollcut-agent" and not s.error]
    assert served and asked
    for s in served:
        assert s.kind == SERVER and set(s.attributes) >= CHAT, s
        assert s.name == f"chat {s.attributes['gen_ai.request.model']}"
        assert s.attributes["rollcut.call.disposition"] in {
            "generated",
            "served_from_log",
            "continued",
            "joined",
        }
    for s in asked:
        assert s.kind == CLIENT and set(s.attributes) >= CHAT, s
        parent = next(p for p in spans if p.span_id == s.parent)
        assert parent.name == "invoke_agent simple" and parent.service == "rollcut-agent"
    # each served call hangs under the agent's call of it
    asked_ids = {s.span_id for s in chats if s.service == "rollcut-agent"}
    assert all(s.parent in asked_ids for s in served)
    tools = [s for s in spans if s.name.startswith("execute_tool ") and s.service == "rollcut-agent"]
    assert tools and all(s.attributes.get("gen_ai.tool.call.id") for s in tools)
    executed = [s for s in spans if s.name.startswith("execute_tool ") and s.service == "rollcut-resources"]
    # what ran, ran once or was served from the log; a late call of an attempt the resume superseded
    # is refused, and its span says so (seen under a full run's load)
    assert any(s.attributes["rollcut.disposition"] == "executed" for s in executed), executed
    assert all(
        s.attributes["rollcut.disposition"] in {"executed", "served_from_log"}
        or (
            s.error
            and s.attributes
            == {**s.attributes, "rollcut.disposition": "refused", "error.type": "stale_attempt"}
        )
        for s in executed
    ), [
        s.attributes
        for s in executed
        if s.attributes.get("rollcut.disposition") not in {"executed", "served_from_log"}
    ]

    # checkpoints: the coordinator's phases under one span, each participant's prepare in its trace
    checkpoints = [s for s in spans if s.name == "rollcut.checkpoint"]
    assert checkpoints
    for ck in checkpoints:
        members = by_trace[ck.trace_id]
        phases = {s.name for s in members if s.parent == ck.span_id}
        assert "rollcut.checkpoint.prepare" in phases and "rollcut.checkpoint.publish" in phases, phases
        prepared = [s for s in members if s.name == "rollcut.participant.prepare"]
        assert {s.service for s in prepared} >= {"rollcut-model", "rollcut-agent", "rollcut-resources"}
        assert all(
            s.attributes["rollcut.checkpoint_id"] == ck.attributes["rollcut.checkpoint_id"] for s in prepared
        )
    assert any(s.name == "rollcut.restore" and s.service == "rollcut-collector" for s in spans)
