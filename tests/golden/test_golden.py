"""Old logs must still replay: every checked-in history folds to the state recorded with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from rollcut import SchemaError
from rollcut.bus import (
    AgentSandbox,
    Codec,
    ModelCallAdmitted,
    RelayDiverged,
    RelayExchange,
    RelayReplayed,
    ResourcesSeeded,
    ResourcesSnapshot,
    ResourcesVerified,
    Subjects,
)
from rollcut.replay import WorkByGroup

from .histories import (
    AGENT_TREE,
    CUT_TREE,
    HERE,
    HISTORIES,
    NAMESPACE,
    SEEDED_TREE,
    STREAMED,
    fold,
    read_frames,
)


@pytest.mark.parametrize("name", sorted(HISTORIES))
def test_v1_history_replays_to_its_recorded_state(name: str) -> None:
    frames = read_frames(HERE / "v1" / f"{name}.frames.jsonl")
    expected = json.loads((HERE / "v1" / f"{name}.state.json").read_text())
    assert fold(frames, Subjects(NAMESPACE)) == expected


def test_every_checked_in_history_is_tested() -> None:
    names = {p.name.removesuffix(".frames.jsonl") for p in (HERE / "v1").glob("*.frames.jsonl")}
    assert names == set(HISTORIES)


def test_golden_history_covers_compressed_and_every_lane() -> None:
    frames = read_frames(HERE / "v1" / "episode_with_continuation.frames.jsonl")
    assert any(f[3] & 1 for _, _, f in frames), "a zstd frame"
    lanes = {subject.split(".")[2] for _, subject, _ in frames}
    assert lanes == {"ev", "fence", "mark"}


def _decoded(name: str) -> list[tuple[int, Any]]:
    """A checked-in history's records as today's codec reads them: (seq, event)."""
    codec = Codec()
    frames = read_frames(HERE / "v1" / f"{name}.frames.jsonl")
    return [(seq, codec.decode(f, seq=seq, subject=subj)) for seq, subj, f in frames]


def test_an_opaque_agents_journal_reads_back_byte_for_byte() -> None:
    codec, subjects = Codec(), Subjects(NAMESPACE)
    frames = read_frames(HERE / "v1" / "opaque_agent_replay.frames.jsonl")
    events = [codec.decode(f, seq=seq, subject=subj) for seq, subj, f in frames]
    journal = [e for e in events if isinstance(e, RelayExchange)]
    assert [(e.n, e.streamed, e.env, e.revision) for e in journal] == [
        (1, False, "", None),
        (2, True, "", None),
        (3, False, "counter", 1),
    ]
    assert journal[1].chunks == STREAMED and journal[0].body == b'{"choices": []}'
    assert [e.n for e in events if isinstance(e, RelayReplayed)] == [1, 2, 3]
    (diverged,) = [e for e in events if isinstance(e, RelayDiverged)]
    assert (diverged.n, diverged.policy) == (4, "fresh_dispatch")
    assert all(subjects.parse(subj).component == "agent" for _, subj, _ in frames[1:5])


def _v0_to_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """v0 called a model call's request digest ``digest``."""
    out = dict(raw)
    out["request_digest"] = out.pop("digest")
    return out


def test_a_v0_record_is_read_as_v1_through_its_upcaster() -> None:
    [(seq, subject, frame)] = read_frames(Path(__file__).parent / "v0" / "model_admitted.frames.jsonl")
    with pytest.raises(SchemaError, match="no upcaster from schema_version 0"):
        Codec().decode(frame, seq=seq, subject=subject)
    ev = Codec(upcasters={("model.admitted", 0): _v0_to_v1}).decode(frame, seq=seq, subject=subject)
    assert isinstance(ev, ModelCallAdmitted)
    assert (ev.schema_version, ev.request_digest, ev.call_id) == (1, "ab" * 8, "c1")


def test_sandbox_records_read_back_and_name_their_trees() -> None:
    """A sandbox session's state records and an opaque agent's ``agent.sandbox`` of schema 1 still
    decode, and still name the trees blob compaction must keep (a tree no record names is freed)."""
    from rollcut.gym.resources._sandbox import _Snapshot
    from rollcut.sandbox._collect import _manifest_in

    codec = Codec()
    frames = read_frames(HERE / "v1" / "sandboxes.frames.jsonl")
    events = [codec.decode(f, seq=seq, subject=subj) for seq, subj, f in frames]
    states = [e.state for e in events if isinstance(e, ResourcesSeeded | ResourcesSnapshot)]
    assert [_manifest_in(s) for s in states] == [SEEDED_TREE, CUT_TREE]
    records = [msgspec.json.decode(s, type=_Snapshot) for s in states if s is not None]
    assert [(r.pristine, r.task.name) for r in records] == [(True, "hello_file"), (False, "hello_file")]
    (agent,) = [e for e in events if isinstance(e, AgentSandbox)]
    assert (agent.provider, agent.ref, agent.exchanges, agent.checkpoint_id) == ("tree", AGENT_TREE, 3, "ck1")


def test_a_journaled_verdict_reads_back_with_the_request_it_answered() -> None:
    subjects = Subjects(NAMESPACE)
    verdicts = [e for _, e in _decoded("upstream_journal") if isinstance(e, ResourcesVerified)]
    assert [(v.attempt, v.revision, v.from_log, v.verdict) for v in verdicts] == [
        (1, 1, False, {"reward": 1.0, "expected_count": 7}),
        (2, 1, True, {"reward": 1.0, "expected_count": 7}),
    ]
    assert {v.request for v in verdicts} == {"ab" * 16}
    assert all(subjects.for_event(v).split(".")[2] == "ev" for v in verdicts)


def test_a_checked_in_history_is_counted_per_group_of_rollouts() -> None:
    """What the demo prints per NeMo Gym server, from the log alone: the continued attempt, the calls
    given again to rebuild its session, the verdict computed once and given again from the journal."""
    by = WorkByGroup(lambda row: row["env"])
    for seq, event in _decoded("upstream_journal"):
        by.add(seq, event)
    counts = by.result()["example_session_state_mgmt"]
    assert {k: counts[k] for k in WorkByGroup.EXTRA} == {
        "rollouts": 1,
        "rows": 0,
        "continued": 1,
        "started_over": 0,
        "divergences": 0,
        "revisions_rebuilt": 1,
        "verdicts_computed": 1,
        "verdicts_from_log": 1,
    }
    assert counts["tool_calls_kept"] == 1 and counts["tool_calls_reexecuted"] == 0
