"""The recorded histories behind ``tests/golden``: how the checked-in logs were made.

Regenerate (only on purpose, when a new schema version adds a history):
``python -m tests.golden.histories``. It writes ``v1/<name>.frames.jsonl``
(every record as the bytes the stream stores, base64, with its sequence and
subject) and ``v1/<name>.state.json`` (what replaying them gives). A later
rollcut must still replay the frames to the same state; that is the test.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from rollcut.bus import (
    AgentBoundary,
    AgentBoundaryRecord,
    AgentSandbox,
    AttemptClaimed,
    AttemptOpened,
    AttemptTombstoned,
    CheckpointCommitted,
    CheckpointPrepared,
    CheckpointSealed,
    Codec,
    Event,
    ModelCallAdmitted,
    ModelCallCompleted,
    ModelCallContinued,
    ModelCallPrefixCut,
    ModelCallReused,
    RelayDiverged,
    RelayExchange,
    RelayReplayed,
    ResourcesMutated,
    ResourcesSeeded,
    ResourcesSnapshot,
    ResourcesVerified,
    ResultAccepted,
    RolloutCompleted,
    RolloutDispatched,
    RolloutRetired,
    StoredEvent,
    Subjects,
    TokenReceipt,
)
from rollcut.replay import Replayer

HERE = Path(__file__).parent
NAMESPACE = "golden"
DIGEST = "ab" * 8


def _receipt(n: int, count: int) -> TokenReceipt:
    return TokenReceipt(receipt_id=f"rc{n}", count=count, digest=f"{n:02x}" * 16)


def _ids() -> Iterator[dict[str, Any]]:
    n = 0
    while True:
        n += 1
        yield {"event_id": f"e{n:04d}", "ts": 1_700_000_000.0 + n}


def episode_with_continuation() -> list[Event]:
    """Two rollouts: r1 runs, is cut mid-call, continues as attempt 2 and is accepted; r2 is retired."""
    ids = _ids()

    def ev(cls: type[Event], component: str, **kw: Any) -> Event:
        return cls(component=component, instance=f"{component}-w0", **next(ids), **kw)  # type: ignore[call-arg]

    r1 = {"rollout_id": "r1"}
    task = {"env": "counter", "prompt": "add numbers " * 200, "seed": {"start": 3}}  # > 1 KiB: zstd
    return [
        ev(RolloutDispatched, "collector", **r1, attempt=1, input=task, input_digest=DIGEST),
        ev(
            RolloutDispatched,
            "collector",
            rollout_id="r2",
            attempt=1,
            input={"env": "x"},
            input_digest=DIGEST,
        ),
        ev(
            ResourcesSeeded, "resources", **r1, attempt=1, session="counter", env="counter", seed={"start": 3}
        ),
        ev(ModelCallAdmitted, "model", **r1, attempt=1, call_id="c1", request_digest=DIGEST),
        ev(
            ModelCallCompleted,
            "model",
            **r1,
            attempt=1,
            call_id="c1",
            request_digest=DIGEST,
            receipt=_receipt(1, 12),
            response={"role": "assistant", "content": None},
        ),
        ev(
            ResourcesMutated,
            "resources",
            **r1,
            attempt=1,
            session="counter",
            revision=1,
            tool="add",
            arguments={"n": 4},
            result={"total": 7},
            delta={"add": 4},
        ),
        ev(
            AgentBoundary,
            "agent",
            **r1,
            attempt=1,
            record=AgentBoundaryRecord(
                turn=1,
                output_items=[{"role": "user", "content": "go"}],
                usage={"input_tokens": 5},
                last_model_call_id="c1",
                resources_revisions={"counter": 1},
            ),
        ),
        ev(
            ModelCallAdmitted,
            "model",
            **r1,
            attempt=1,
            call_id="c2",
            request_digest="cd" * 8,
            parent_call_id="c1",
        ),
        ev(CheckpointPrepared, "coordinator", checkpoint_id="ck1", deadline=1_700_000_100.0),
        ev(
            ModelCallPrefixCut,
            "model",
            **r1,
            attempt=1,
            call_id="c2",
            receipt=_receipt(2, 3),
            token_boundary=3,
            buffer_id="b2",
        ),
        ev(
            CheckpointSealed,
            "coordinator",
            checkpoint_id="ck1",
            participants=["model-w0"],
            last_seqs={"model-w0": 10},
        ),
        ev(
            CheckpointCommitted,
            "coordinator",
            checkpoint_id="ck1",
            cut=11,
            token_snapshot_id="s1",
            token_snapshot_digest=DIGEST,
            participants=["model-w0"],
        ),
        ev(AttemptTombstoned, "coordinator", **r1, attempt=1, reason="restore", next_attempt=2),
        ev(
            AttemptOpened,
            "coordinator",
            **r1,
            attempt=2,
            previous_attempt=1,
            checkpoint_id="ck1",
            from_cut=11,
        ),
        ev(
            ModelCallReused,
            "model",
            **r1,
            attempt=2,
            call_id="c3",
            request_digest=DIGEST,
            source_call_id="c1",
            source_attempt=1,
            receipt=_receipt(1, 12),
        ),
        ev(
            ModelCallContinued,
            "model",
            **r1,
            attempt=2,
            call_id="c4",
            request_digest="cd" * 8,
            source_call_id="c2",
            source_attempt=1,
            prefix_receipt=_receipt(2, 3),
            token_boundary=3,
            delivery="inline",
            parent_call_id="c3",
        ),
        ev(
            ModelCallCompleted,
            "model",
            **r1,
            attempt=2,
            call_id="c4",
            request_digest="cd" * 8,
            receipt=_receipt(4, 9),
            parent_call_id="c3",
            finish_reason="stop",
        ),
        ev(RolloutCompleted, "environment", **r1, attempt=2, result_digest=DIGEST, reward=1.0),
        ev(ResultAccepted, "collector", **r1, attempt=2, result_digest=DIGEST, reward=1.0),
        ev(RolloutRetired, "collector", rollout_id="r2", attempt=1, reason="budget"),
    ]


STREAMED = [b'data: {"choices": [{"delta": {"role": "assistant"}}]}\n\n', b"data: [DONE]\n\n"]
"""The chunks of the streamed exchange in :func:`opaque_agent_replay`, as the agent received them."""


def opaque_agent_replay() -> list[Event]:
    """An opaque agent's rollout: three journaled exchanges (plain, streamed, a tool call), a crash,
    attempt 2 replaying them and diverging at its fourth request."""
    ids = _ids()

    def ev(cls: type[Event], component: str, **kw: Any) -> Event:
        return cls(component=component, instance=f"{component}-w0", **next(ids), **kw)  # type: ignore[call-arg]

    o = {"rollout_id": "o1"}
    route, tool = "/v1/chat/completions", "/tools/counter/add"

    def exchange(n: int, attempt: int, **kw: Any) -> Event:
        return ev(
            RelayExchange,
            "agent",
            **o,
            attempt=attempt,
            n=n,
            method="POST",
            request_digest=f"{n:02x}" * 16,
            **kw,
        )

    return [
        ev(RolloutDispatched, "collector", **o, attempt=1, input={"env": "counter"}, input_digest=DIGEST),
        ev(AttemptClaimed, "agent", **o, attempt=1),
        exchange(1, 1, route=route, status=200, content_type="application/json", body=b'{"choices": []}'),
        exchange(
            2, 1, route=route, status=200, content_type="text/event-stream", chunks=STREAMED, streamed=True
        ),
        exchange(
            3,
            1,
            route=tool,
            status=200,
            content_type="application/json",
            body=b"{}",
            env="counter",
            revision=1,
        ),
        ev(AttemptTombstoned, "coordinator", **o, attempt=1, reason="restore", next_attempt=2),
        ev(AttemptOpened, "coordinator", **o, attempt=2, previous_attempt=1, checkpoint_id="ck1", from_cut=5),
        *(
            ev(RelayReplayed, "agent", **o, attempt=2, n=n, request_digest=f"{n:02x}" * 16, source_attempt=1)
            for n in (1, 2, 3)
        ),
        ev(
            RelayDiverged,
            "agent",
            **o,
            attempt=2,
            n=4,
            method="POST",
            route=route,
            request_digest="ee" * 16,
            expected_route=route,
            expected_digest="04" * 16,
            policy="fresh_dispatch",
            why="request 4 differs from the journal",
        ),
    ]


SEEDED_TREE, CUT_TREE, AGENT_TREE = "5e" * 32, "c7" * 32, "a9" * 32
"""The manifests the sandbox history names (trees in the blob bucket, by their SHA-256)."""


def _tree_record(manifest: str, *, pristine: bool) -> bytes:
    """A ``sandbox`` session's state record (schema 1) as the environment logs it."""
    task = {"name": "hello_file", "prompt": "p", "files": {"README.md": "x"}, "check": "true"}
    record = {"manifest": manifest, "task": task, "files": 1, "bytes": 1, "schema": 1, "pristine": pristine}
    return json.dumps(record).encode()


def sandboxes() -> list[Event]:
    """Sandboxes across a checkpoint: a ``sandbox`` session seeded (its tree named, pristine),
    changed and snapshotted at a prepare; an opaque agent's working directory snapshotted too."""
    ids = _ids()

    def ev(cls: type[Event], component: str, **kw: Any) -> Event:
        return cls(component=component, instance=f"{component}-w0", **next(ids), **kw)  # type: ignore[call-arg]

    s, o = {"rollout_id": "s1", "attempt": 1}, {"rollout_id": "o1", "attempt": 1}
    return [
        ev(RolloutDispatched, "collector", **s, input={"env": "sandbox"}, input_digest=DIGEST),
        ev(
            ResourcesSeeded,
            "resources",
            **s,
            session="sandbox",
            env="sandbox",
            seed={"task": "hello_file"},
            state=_tree_record(SEEDED_TREE, pristine=True),
        ),
        ev(
            ResourcesMutated,
            "resources",
            **s,
            session="sandbox",
            revision=1,
            tool="run",
            arguments={"command": "echo hello sandbox > out.txt"},
            result={"exit_code": 0, "stdout": "", "stderr": "", "timed_out": False},
        ),
        ev(RolloutDispatched, "collector", **o, input={"env": "counter"}, input_digest=DIGEST),
        ev(CheckpointPrepared, "coordinator", checkpoint_id="ck1", deadline=1_700_000_100.0),
        ev(
            ResourcesSnapshot,
            "resources",
            **s,
            session="sandbox",
            revision=1,
            codec="sandbox",
            codec_version=1,
            state=_tree_record(CUT_TREE, pristine=False),
            digest=DIGEST,
        ),
        ev(
            AgentSandbox,
            "agent",
            **o,
            provider="tree",
            checkpoint_id="ck1",
            ref=AGENT_TREE,
            exchanges=3,
            files=2,
            bytes=40,
        ),
    ]


def upstream_journal() -> list[Event]:
    """A session of a resources server rollcut did not write (NeMo Gym's counter): its seed and each
    call journaled with its answer, its verdict journaled, a crash, and the continued attempt's
    session rebuilt by replay and its verdict given again from the journal."""
    ids = _ids()

    def ev(cls: type[Event], component: str, **kw: Any) -> Event:
        return cls(component=component, instance=f"{component}-w0", **next(ids), **kw)  # type: ignore[call-arg]

    u = {"rollout_id": "u1"}
    name, seed = "example_session_state_mgmt", {"initial_count": 3}
    journal = {"v": 1, "seed": seed, "seed_answer": {}, "calls": []}
    verdict = {"reward": 1.0, "expected_count": 7}
    return [
        ev(RolloutDispatched, "collector", **u, attempt=1, input={"env": name}, input_digest=DIGEST),
        ev(
            ResourcesSeeded,
            "resources",
            **u,
            attempt=1,
            session=name,
            env=name,
            seed=seed,
            state=json.dumps(journal).encode(),
        ),
        ev(
            ResourcesMutated,
            "resources",
            **u,
            attempt=1,
            session=name,
            revision=1,
            tool="increment_counter",
            arguments={"count": 4},
            result={"success": True},
            delta={"answer": {"success": True}},
        ),
        ev(
            ResourcesVerified,
            "resources",
            **u,
            attempt=1,
            session=name,
            revision=1,
            request=DIGEST * 2,
            verdict=verdict,
        ),
        ev(AttemptTombstoned, "coordinator", **u, attempt=1, reason="restore", next_attempt=2),
        ev(AttemptOpened, "coordinator", **u, attempt=2, previous_attempt=1, checkpoint_id="ck1", from_cut=4),
        ev(ResourcesSeeded, "resources", **u, attempt=2, session=name, env=name, seed=seed, revision=1),
        ev(
            ResourcesVerified,
            "resources",
            **u,
            attempt=2,
            session=name,
            revision=1,
            request=DIGEST * 2,
            verdict=verdict,
            from_log=True,
        ),
    ]


def writers_on_their_subjects() -> list[Event]:
    """Issue 54's shape: each Gym server instance's events on a subject that names it. w1 runs to its
    result; w2's attempt 1 is held by model-w0, and model-w1 writes there too (the rollout is
    recorded as foreign); w2 then goes on as attempt 2, which model-w1 holds alone."""
    ids = _ids()

    def ev(cls: type[Event], component: str, instance: str = "", **kw: Any) -> Event:
        who = instance or f"{component}-w0"
        return cls(component=component, instance=who, **next(ids), **kw)  # type: ignore[call-arg]

    out: list[Event] = []
    for rid in ("w1", "w2"):
        out.append(
            ev(
                RolloutDispatched,
                "collector",
                rollout_id=rid,
                attempt=1,
                input={"env": "counter"},
                input_digest=DIGEST,
            )
        )
    w1, w2 = {"rollout_id": "w1", "attempt": 1}, {"rollout_id": "w2", "attempt": 1}
    out += [
        ev(AttemptClaimed, "agent", **w1),
        ev(ResourcesSeeded, "resources", **w1, session="counter", env="counter", seed={"start": 1}),
        ev(ModelCallAdmitted, "model", **w1, call_id="c1", request_digest=DIGEST),
        ev(
            ModelCallCompleted,
            "model",
            **w1,
            call_id="c1",
            request_digest=DIGEST,
            receipt=_receipt(1, 9),
            response={"role": "assistant", "content": "2"},
        ),
        ev(
            AgentBoundary,
            "agent",
            **w1,
            record=AgentBoundaryRecord(
                turn=1, output_items=[{"role": "assistant", "content": "2"}], last_model_call_id="c1"
            ),
        ),
        ev(RolloutCompleted, "agent", **w1, reward=1.0, result_digest=DIGEST),
        ev(ResultAccepted, "collector", **w1, result_digest=DIGEST),
        ev(AttemptClaimed, "agent", **w2),
        ev(ModelCallAdmitted, "model", **w2, call_id="c2", request_digest=DIGEST),
        ev(ModelCallAdmitted, "model", "model-w1", **w2, call_id="c3", request_digest=DIGEST),
        ev(AttemptTombstoned, "coordinator", rollout_id="w2", attempt=1, reason="restore", next_attempt=2),
        ev(AttemptOpened, "coordinator", rollout_id="w2", attempt=2, previous_attempt=1, from_cut=0),
        ev(
            ModelCallAdmitted,
            "model",
            "model-w1",
            rollout_id="w2",
            attempt=2,
            call_id="c4",
            request_digest=DIGEST,
        ),
    ]
    return out


HISTORIES = {
    "episode_with_continuation": episode_with_continuation,
    "opaque_agent_replay": opaque_agent_replay,
    "sandboxes": sandboxes,
    "upstream_journal": upstream_journal,
    "writers_on_their_subjects": writers_on_their_subjects,
}


def stored(events: list[Event], subjects: Subjects) -> list[tuple[int, str, bytes]]:
    """What the stream would hold: (seq, subject, frame) in order."""
    codec = Codec()
    return [(i, subjects.for_event(e), codec.encode(e)) for i, e in enumerate(events, start=1)]


def fold(records: list[tuple[int, str, bytes]], subjects: Subjects) -> dict[str, Any]:
    """Replay stored frames (decoded by today's codec) into builtins."""
    codec = Codec()
    rp = Replayer(subjects)
    for seq, subject, frame in records:
        rp.apply(StoredEvent(seq, subject, codec.decode(frame, seq=seq, subject=subject)))
    out: dict[str, Any] = msgspec.to_builtins(rp.result)
    return json.loads(json.dumps(out))


def read_frames(path: Path) -> list[tuple[int, str, bytes]]:
    """The records of a checked-in ``*.frames.jsonl``."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(r["seq"], r["subject"], base64.b64decode(r["frame"])) for r in rows]


def write(name: str, version_dir: Path) -> None:
    subjects = Subjects(NAMESPACE)
    records = stored(HISTORIES[name](), subjects)
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / f"{name}.frames.jsonl").write_text(
        "".join(
            json.dumps({"seq": s, "subject": subj, "frame": base64.b64encode(f).decode()}) + "\n"
            for s, subj, f in records
        )
    )
    (version_dir / f"{name}.state.json").write_text(
        json.dumps(fold(records, subjects), indent=1, sort_keys=True)
    )


if __name__ == "__main__":
    import sys

    for name in sys.argv[1:] or HISTORIES:  # name one to add it without rewriting the others
        write(name, HERE / "v1")
