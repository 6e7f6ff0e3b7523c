"""Replay up to a cut equals what the live participants held at that point."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec

from rollcut.bus import (
    EventLog,
    ModelCallAdmitted,
    ModelCallCompleted,
    ResourcesMutated,
    ResultAccepted,
    StoredEvent,
    TokenReceipt,
)
from rollcut.replay import FoldRegistry, default_registry, replay

from ..helpers import boundary_event, counter_event, model_event


class CounterFold:
    """How the counter environment's mutation events fold into its value."""

    def initial(self) -> dict[str, int]:
        return {"value": 0, "revision": 0}

    def apply(self, state: dict[str, int], stored: StoredEvent) -> dict[str, int]:
        ev = stored.event
        if isinstance(ev, ResourcesMutated):
            return {"value": state["value"] + int(ev.delta), "revision": ev.revision}
        return state


class LiveCounter:
    """A live participant: it owns its state and writes before it acts."""

    def __init__(self, log: EventLog, rollout_id: str) -> None:
        self.log, self.rollout_id = log, rollout_id
        self.value = 0
        self.revision = 0

    async def add(self, n: int) -> int:
        seq = await self.log.append(counter_event(self.rollout_id, self.revision + 1, n))
        self.value += n
        self.revision += 1
        return seq


def _registry() -> FoldRegistry:
    reg = default_registry()
    reg.register("resources", CounterFold(), replace=True)
    return reg


async def test_replayed_prefix_equals_live_state(log: EventLog) -> None:
    rng = random.Random(7)
    rollouts = ["a", "b", "c"]
    for r in rollouts:
        await log.dispatch(r, {"task": r}, instance="collector-0")
    counters = {r: LiveCounter(log, r) for r in rollouts}
    turns = dict.fromkeys(rollouts, 0)
    completed: dict[str, list[str]] = {r: [] for r in rollouts}
    snapshots: list[tuple[int, dict[str, tuple[int, int, int, list[str]]]]] = []
    for step in range(120):
        r = rng.choice(rollouts)
        action = rng.random()
        if action < 0.5:
            seq = await counters[r].add(rng.randint(-5, 9))
        elif action < 0.8:
            call = f"{r}-call{step}"
            seq = await log.append(
                ModelCallCompleted(
                    component="model",
                    instance="model-0",
                    rollout_id=r,
                    attempt=1,
                    call_id=call,
                    request_digest="cd" * 8,
                    receipt=TokenReceipt(receipt_id=f"t{step}", count=3, digest="ef" * 8),
                )
            )
            completed[r].append(call)
        else:
            seq = await log.append(boundary_event(r, turns[r]))
            turns[r] += 1
        live = {x: (counters[x].value, counters[x].revision, turns[x], list(completed[x])) for x in rollouts}
        snapshots.append((seq, live))

    for seq, live in [*rng.sample(snapshots, 12), snapshots[0], snapshots[-1]]:
        res = await replay(log, up_to=seq, registry=_registry())
        assert res.cut == seq
        for r in rollouts:
            a = res.rollouts[r].current()
            assert a is not None
            counter = a.sessions.get("resources", {"value": 0, "revision": 0})
            agent = a.sessions.get("agent")
            model = a.sessions.get("model")
            replayed = (
                counter["value"],
                counter["revision"],
                agent.boundaries if agent else 0,
                [c for c, st in model.calls.items() if st.status == "completed"] if model else [],
            )
            assert replayed == live[r], f"rollout {r} at seq {seq}"


async def test_replay_of_one_rollout_matches_the_full_replay(log: EventLog) -> None:
    for r in ("x", "y"):
        await log.dispatch(r, {"r": r}, instance="c")
        for i in range(5):
            await log.append(model_event(r, call_id=f"{r}{i}"))
    await log.supersede("x", 1, instance="coord")
    await log.append(model_event("x", attempt=2, call_id="x-new"))
    full = await replay(log)
    one = await replay(log, rollout_id="x")
    assert set(one.rollouts) == {"x"}
    assert msgspec.to_builtins(one.rollouts["x"]) == msgspec.to_builtins(full.rollouts["x"])
    x = one.rollouts["x"]
    assert (x.current_attempt, x.open, sorted(x.attempts)) == (2, True, [1, 2])
    assert x.attempts[1].tombstoned_seq is not None
    assert list(x.attempts[2].sessions["model"].calls) == ["x-new"]
    assert x.input == {"r": "x"}


async def test_corrupt_event_quarantines_only_its_rollout(log: EventLog) -> None:
    for r in ("good", "bad"):
        await log.dispatch(r, {}, instance="c")
        await log.append(model_event(r))
    frame = bytearray(log.codec.encode(model_event("bad")))
    frame[25] ^= 0xFF
    ack = await log.nc.jetstream().publish(log.subjects.event("bad", 1, "model"), bytes(frame))
    res = await replay(log)
    assert res.rollouts["bad"].status == "corrupt"
    assert res.rollouts["bad"].corrupt_seqs == [ack.seq]
    assert res.rollouts["good"].status == "running"
    assert res.rollouts["good"].corrupt_seqs == []


async def test_the_streaming_fold_drops_what_finished_and_keeps_what_runs(log: EventLog) -> None:
    """A restore's replay holds only the rollouts it may rebuild: one accepted and one retired
    rollout keep their status and counts but no sessions; the running one is folded in full, and
    equals the full replay of it."""
    for r in ("done", "gone", "running"):
        await log.dispatch(r, {"r": r}, instance="c")
        for i in range(3):
            await log.append(model_event(r, call_id=f"{r}{i}"))
    await log.append(
        ResultAccepted(
            component="collector", instance="c", rollout_id="done", attempt=1, result_digest="ab" * 8
        )
    )
    await log.append(model_event("done", call_id="late"))  # after acceptance: counted, not folded
    await log.retire("gone", reason="poisoned", instance="c")
    full = await replay(log)
    lean = await replay(log, keep_finished=False)
    assert lean.events == full.events and lean.cut == full.cut
    for r in ("done", "gone"):
        assert lean.rollouts[r].status == full.rollouts[r].status != "running"
        assert full.rollouts[r].attempts[1].sessions and not lean.rollouts[r].attempts[1].sessions
        assert lean.rollouts[r].attempts[1].events == full.rollouts[r].attempts[1].events
    assert len(full.rollouts["done"].attempts[1].sessions["model"].calls) == 4
    assert msgspec.to_builtins(lean.rollouts["running"]) == msgspec.to_builtins(full.rollouts["running"])
    assert len(lean.rollouts["running"].attempts[1].sessions["model"].calls) == 3


async def test_a_cut_recorded_after_its_calls_completion_leaves_the_call_completed(
    log: EventLog, tmp_path: Path
) -> None:
    """A prepare freezes a call while it is finishing: its completion can reach the log before the
    cut's event. The call is completed whatever the order: continuing its prefix would generate
    again what its caller already received (and acted on)."""
    from rollcut.bus import ModelCallPrefixCut
    from rollcut.ledger import Ledger, Projector

    await log.dispatch("r1", {}, instance="collector")
    done = TokenReceipt(receipt_id="whole", count=9, digest="ab" * 16)
    part = TokenReceipt(receipt_id="prefix", count=4, digest="cd" * 16)
    ev = {"component": "model", "instance": "model-0", "rollout_id": "r1", "attempt": 1, "call_id": "c1"}
    await log.append(ModelCallAdmitted(**ev, request_digest="ef" * 8))
    await log.append(ModelCallCompleted(**ev, request_digest="ef" * 8, receipt=done))
    cut = await log.append(ModelCallPrefixCut(**ev, receipt=part, token_boundary=4, buffer_id="c1-b1"))
    call = (await replay(log, up_to=cut)).rollouts["r1"].attempts[1].sessions["model"].calls["c1"]
    assert (call.status, call.receipt) == ("completed", done)
    with Ledger(tmp_path / "ledger") as led:
        await Projector(led, log).catch_up()
        assert led.call_status("r1", 1, "c1") == "completed"


def test_a_continuation_seeded_without_state_keeps_the_deltas_it_continues_from() -> None:
    """One fold of a resources session for replay and the view: a re-seeding above revision 0 re-bases
    the session on the state it carries, and one that carries none keeps the base and the deltas
    (replay used to start the session over and lose them); a seeding at revision 0 starts over."""
    from rollcut.bus import ResourcesSeeded
    from rollcut.replay import ResourcesFold

    def seeded(revision: int, state: bytes | None) -> ResourcesSeeded:
        ev = dict(component="resources", instance="r", rollout_id="r1", attempt=2, session="counter")
        return ResourcesSeeded(**ev, env="counter", seed={"start": 1}, revision=revision, state=state)

    fold = ResourcesFold()
    sessions = fold.initial()
    steps = [seeded(0, b"base"), counter_event("r1", 1, 5), counter_event("r1", 2, 6), seeded(2, None)]
    for seq, ev in enumerate(steps, 1):
        sessions = fold.apply(sessions, StoredEvent(seq, "", ev))
    s = sessions.sessions["counter"]
    assert (s.state, s.state_revision, [m.delta for m in s.mutations], s.revision) == (b"base", 0, [5, 6], 2)
    assert s.seed == {"start": 1} and s.last_seq == 4
    sessions = fold.apply(sessions, StoredEvent(5, "", seeded(2, b"moved")))
    assert (s.state, s.state_revision, s.mutations) == (b"moved", 2, [])
    sessions = fold.apply(sessions, StoredEvent(6, "", seeded(0, b"fresh")))
    assert sessions.sessions["counter"] is not s and sessions.sessions["counter"].state == b"fresh"


def test_a_sessions_replay_queue_starts_over_with_the_session_and_keeps_no_unseeded_calls() -> None:
    """The view's replay queue follows the one resources fold: a seeding at revision 0 starts the
    session, and its calls, over; a call of a session not seeded on the lineage is no session's."""
    from rollcut.bus import ResourcesSeeded
    from rollcut.replay._view import _LineageFold

    def seeded(revision: int) -> ResourcesSeeded:
        ev = dict(component="resources", instance="r", rollout_id="r1", attempt=1, session="counter")
        return ResourcesSeeded(**ev, env="counter", seed={}, revision=revision, state=b"s")

    lineage = _LineageFold()
    steps = [counter_event("r1", 1, 9), seeded(0), counter_event("r1", 1, 5), seeded(0)]
    steps += [counter_event("r1", 1, 6), counter_event("r1", 2, 7)]
    for seq, ev in enumerate(steps, 1):
        lineage.apply(StoredEvent(seq, "", ev))
    sessions = lineage.finish()
    assert list(sessions) == ["counter"]
    assert [m.delta for m in lineage.replay_queues["counter"]] == [6, 7]
