"""A participant still holding a checkpoint whose coordinator died, after the lane has let it go.

The lane frees a dead checkpoint once its deadline and the coordinator's grace have passed; the
participant's lease ends it once its deadline and the participant's grace have passed, on its own
clock and timer. The two need not agree (two hosts, a loaded loop, a longer lease), and a
collection requeued after a partition met a server still holding the checkpoint the partition cut
off: its restore was refused as busy and the run exited 2. Here the participant's lease is ten
minutes, so the two can only meet through the coordinator telling it the checkpoint is dead.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from rollcut import RollcutError
from rollcut.bus import CheckpointAborted, EventLog
from rollcut.ledger import Ledger
from rollcut.participants import Coordinator, Restorer
from rollcut.tokens import LocalTokenStore

LEASE_S = 600.0


@pytest.mark.slow
async def test_a_checkpoint_after_a_coordinator_killed_mid_checkpoint_ends_the_dead_one_everywhere(
    log: EventLog, participants: Any, ledger: Ledger, kill_coordinator_after: Any, checkpoint_when_free: Any
) -> None:
    p = await participants("res-0", "exported", lease_grace_s=LEASE_S)
    await kill_coordinator_after("seal")  # its seal on the lane: res-0 prepared, and nobody will release it
    held = p.capabilities().active_checkpoint
    assert held and p.gate.state == "closed"
    res = await checkpoint_when_free()  # the lane is the dead one's until its deadline and grace pass
    assert [c.checkpoint_id for c in ledger.checkpoints()] == [res.record.checkpoint_id]
    assert res.participants == ["res-0"] and p.lease_expiries == 0  # ended by the coordinator, not the lease
    assert p.gate.state == "open" and p.capabilities().active_checkpoint is None
    aborted = [s.event.checkpoint_id async for s in log.read() if isinstance(s.event, CheckpointAborted)]
    assert aborted == [held]


async def test_a_restore_ends_a_checkpoint_the_lane_let_go_and_never_a_live_one(
    log: EventLog, participants: Any, coordinator: Coordinator, ledger: Ledger, tokens: LocalTokenStore
) -> None:
    p = await participants("res-0", "exported", lease_grace_s=LEASE_S)
    rec = (await coordinator.checkpoint(deadline_s=5)).record
    restorer = Restorer(log, ledger, coordinator, instance="collector-0", deadline_s=5)
    [info] = await coordinator.discover()

    # a checkpoint still live on the lane (its marker the last entry) is not the restorer's to end
    live = Coordinator(log, ledger, tokens, grace_s=0.3, discovery_idle_s=0.05, instance="other")
    lane_seq = await live._acquire("live", time.time() + LEASE_S)
    assert (await live.call(info, "prepare", "live", time.time() + LEASE_S)).ok
    with pytest.raises(RollcutError, match="busy"):
        await restorer.restore(rec.checkpoint_id, rec.cut)
    assert p.capabilities().active_checkpoint == "live"

    # once the lane has moved past it (the coordinator aborted it there), the restore ends it and goes on
    await live._abort("live", lane_seq, [], RuntimeError("its coordinator is gone"))  # no participant told
    assert p.capabilities().active_checkpoint == "live"  # told nothing: its lease would run ten minutes
    assert await restorer.restore(rec.checkpoint_id, rec.cut) == ["res-0"]
    await restorer.resume(rec.checkpoint_id)
    assert p.gate.state == "open" and p.capabilities().active_checkpoint is None and p.lease_expiries == 0
