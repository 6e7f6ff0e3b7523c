"""The release, the step issue 53 changed to one wave: a lost reply, a late participant and a crash
there, each against a real nats-server (docs/control-plane.md, step 5)."""

from __future__ import annotations

import asyncio
from typing import Any

from rollcut.ledger import Ledger
from rollcut.participants import Coordinator

from ..helpers import until


class Releases:
    """Counts what a participant was told to let go of (its parked work goes on once per checkpoint)."""

    def __init__(self) -> None:
        self.released: list[str] = []

    async def prepare(self, checkpoint_id: str) -> list[str]:
        return []

    async def restore(self, checkpoint_id: str, cut: int) -> None:
        return None

    def release(self, checkpoint_id: str) -> None:
        self.released.append(checkpoint_id)


async def test_a_lost_resume_reply_is_asked_again_and_the_participant_lets_go_once(
    participants: Any, coordinator: Coordinator, ledger: Ledger
) -> None:
    hooks = Releases()
    p = await participants("res-0", "exported", hooks=hooks)

    async def lose_the_first_resume_reply(req: Any) -> None:
        if req.op == "resume" and not hooks.released:
            p.drop_replies = 1

    p.on_control = lose_the_first_resume_reply
    coordinator.per_try_s = 0.3
    res = await coordinator.checkpoint(deadline_s=5)
    assert res.resumed == ["res-0"] and p.gate.state == "open"
    assert hooks.released == [res.record.checkpoint_id]  # asked twice, let go once
    assert ledger.checkpoint(res.record.checkpoint_id) is not None


async def test_a_server_late_to_answer_its_resume_does_not_hold_the_agent(
    participants: Any, coordinator: Coordinator, ledger: Ledger
) -> None:
    """One wave: the agent is reopened while the model server's resume is still unanswered (in
    waves, servers first, the agent waited for the slowest server's answer)."""
    model = await participants("model-0", "exported", component="model")
    agent_hooks = Releases()
    agent = await participants("agent-0", "exported", component="agent", hooks=agent_hooks)
    answer = asyncio.Event()

    async def hold_the_resume(req: Any) -> None:
        if req.op == "resume":
            await answer.wait()

    model.on_control = hold_the_resume
    task = asyncio.create_task(coordinator.checkpoint(deadline_s=10))
    try:
        await until(lambda: bool(agent_hooks.released), timeout=10, what="the agent released")
        assert agent.gate.state == "open"
        assert model.gate.state == "closed", "the model server answered its resume already"
        assert not task.done()
    finally:
        answer.set()
    res = await task
    assert sorted(res.resumed) == ["agent-0", "model-0"] and model.gate.state == "open"
    assert ledger.checkpoint(res.record.checkpoint_id) is not None


async def test_a_participant_killed_before_its_release_is_left_to_its_lease_and_the_rest_go_on(
    nats_url: str, namespace: str, participants: Any, coordinator: Coordinator, ledger: Ledger, spawn: Any
) -> None:
    """SIGKILLed after the seal: the checkpoint still publishes (its cut is fixed), the others are
    reopened, and the dead one, asked at a dead subject, is not asked in a busy loop until the
    release's deadline."""
    live = await participants("res-live", "exported")
    proc = spawn("participant", "--url", nats_url, "--ns", namespace, "--instance", "victim")
    await proc.aexpect("READY")
    sent: dict[str, int] = {}

    async def kill_after_the_seal(phase: str) -> None:
        if phase == "seal":
            proc.kill()
            sent["at_seal"] = coordinator.log.nc.stats["out_msgs"]
        elif phase == "release":
            sent["at_release"] = coordinator.log.nc.stats["out_msgs"]

    coordinator.after_phase = kill_after_the_seal
    res = await coordinator.checkpoint(deadline_s=3, expect={"victim", "res-live"})
    assert sorted(res.record.participants) == ["res-live", "victim"]
    assert res.resumed == ["res-live"] and live.gate.state == "open"
    assert ledger.checkpoint(res.record.checkpoint_id) is not None
    asked = sent["at_release"] - sent["at_seal"]
    assert asked <= 60, f"{asked} requests to release two participants, one of them dead"
