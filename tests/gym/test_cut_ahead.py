"""Cuts taken ahead of a prepare (``gym/model/_ahead.py``): with admission open, a lead before the
next prepare is due, so that prepare reports them instead of writing them in the pause."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from rollcut.bus import BusConfig, CheckpointPrepared, EventLog, ModelCallPrefixCut
from rollcut.gym.model import LocalBackend
from rollcut.gym.model._ahead import CutAhead

from ..helpers import until
from .conftest import ModelRig, rig_for

BODY = {"messages": [{"role": "user", "content": "a long answer"}]}


def _noop() -> None:
    pass


async def test_a_period_is_learnt_only_from_steady_prepares() -> None:
    ahead = CutAhead()
    assert ahead.period() is None and ahead.fresh_since(10.0) == math.inf
    for t in (0.0, 0.5):
        ahead.prepared(t, _noop)
    assert ahead.period() is None  # one gap is no rhythm
    ahead.prepared(1.0, _noop)
    assert ahead.period() == 0.5 and ahead.lead(0.5) == 0.05
    # a prepare may report a cut taken since the last prepare and within a period of it
    assert ahead.fresh_since(1.4) == 1.0 and ahead.fresh_since(2.0) == 1.5
    ahead.prepared(3.0, _noop)  # a manual checkpoint, out of step: nothing is predicted
    assert ahead.period() is None and ahead.fresh_since(3.5) == math.inf


async def _generating(rig: ModelRig, rollout_id: str, at_least: int) -> asyncio.Future[Any]:
    call = asyncio.ensure_future(
        rig.client.post("/v1/chat/completions", json=BODY, headers=rig.headers(rollout_id))
    )
    await until(
        lambda: any(
            f.ident.rollout_id == rollout_id and len(f.emitted) >= at_least
            for f in rig.service._inflight.values()
        ),
        what=f"{at_least} tokens generated",
    )
    return call


def _emitted(rig: ModelRig) -> int:
    return max(len(f.emitted) for f in rig.service._inflight.values())


def _steady(rig: ModelRig) -> None:
    """As if prepares had come at a steady period, the last just now: a cut taken ahead now is fresh
    for the next prepare whenever it comes in this test."""
    ahead = rig.service._inflight.ahead = CutAhead()
    now = asyncio.get_running_loop().time()
    for t in (now - 2000.0, now - 1000.0, now):
        ahead.prepared(t, _noop)


async def _restored(
    rig: ModelRig, backend: LocalBackend, call: asyncio.Future[Any], res: Any, rollout_id: str = "r1"
) -> Any:
    """The crash: attempt 1 is superseded from ``res`` while its call still generates (its end is
    then refused); attempt 2 makes the same call. Its answer."""
    await rig.log.supersede(
        rollout_id, 1, instance="coordinator", checkpoint_id=res.record.checkpoint_id, from_cut=res.record.cut
    )
    backend.token_delay_s = 0.0
    late = await call
    assert late.status_code == 409 and late.json()["error"]["code"] == "stale_attempt", late.text
    answer = await rig.client.post("/v1/chat/completions", json=BODY, headers=rig.headers(rollout_id, 2))
    return answer.json()


def _exact(again: Any, backend: LocalBackend, continued_from: int) -> None:
    """The restored call's answer continued ``continued_from`` tokens and gives the uninterrupted
    call's tokens."""
    assert again["rollcut"]["continued_from"] == continued_from
    assert again["choices"][0]["message"]["generation_token_ids"] == backend.plan(BODY).output_ids


async def _cuts(log: EventLog, rollout_id: str) -> list[Any]:
    return [s async for s in log.read(rollout_id=rollout_id) if isinstance(s.event, ModelCallPrefixCut)]


async def _prepared_at(log: EventLog, checkpoint_id: str) -> int:
    [seq] = [
        s.seq
        async for s in log.read()
        if isinstance(s.event, CheckpointPrepared) and s.event.checkpoint_id == checkpoint_id
    ]
    return seq


async def test_a_prepare_reports_the_cut_taken_ahead_writes_nothing_and_the_continuation_is_exact(
    log: EventLog, bus_config: BusConfig, tmp_path: Any
) -> None:
    backend = LocalBackend(seed=7, token_delay_s=0.01)
    async with rig_for(log, bus_config, tmp_path, backend) as rig:
        await log.dispatch("r1", {}, instance="collector")
        call = await _generating(rig, "r1", 5)
        _steady(rig)
        assert await rig.service._inflight.cut_ahead() == 1
        assert rig.service.stats["cuts_ahead"] == 1
        [ahead] = await _cuts(log, "r1")
        await until(lambda: _emitted(rig) > ahead.event.token_boundary, what="tokens past the cut ahead")
        res = await rig.coordinator.checkpoint(deadline_s=10)
        # the prepare wrote no cut: the one taken ahead, below the checkpoint's start, is what it kept
        assert [c.seq for c in await _cuts(log, "r1")] == [ahead.seq]
        assert ahead.seq < await _prepared_at(log, res.record.checkpoint_id) < res.record.cut
        again = await _restored(rig, backend, call, res)
    # the continuation from the cut taken ahead gives the tokens of the uninterrupted call
    _exact(again, backend, ahead.event.token_boundary)


async def test_a_call_that_began_after_the_cut_ahead_is_kept_from_nothing_and_regenerated_exactly(
    log: EventLog, bus_config: BusConfig, tmp_path: Any
) -> None:
    """After a cut ahead the prepare writes nothing at all: a call whose first tokens came after it
    is reported with nothing kept, and a crash then generates it again from its input."""
    backend = LocalBackend(seed=7, token_delay_s=0.01)
    async with rig_for(log, bus_config, tmp_path, backend) as rig:
        await log.dispatch("r1", {}, instance="collector")
        await log.dispatch("r2", {}, instance="collector")
        first = await _generating(rig, "r1", 5)
        _steady(rig)
        assert await rig.service._inflight.cut_ahead() == 1
        late = await _generating(rig, "r2", 3)
        res = await rig.coordinator.checkpoint(deadline_s=10)
        assert len(await _cuts(log, "r1")) == 1 and await _cuts(log, "r2") == []
        assert res.record.quarantined == {}
        again = await _restored(rig, backend, late, res, "r2")
        assert (await first).status_code == 200
    _exact(again, backend, 0)


async def test_a_prepare_that_arrives_while_a_cut_ahead_writes_waits_for_it_and_reports_it(
    log: EventLog, bus_config: BusConfig, tmp_path: Any
) -> None:
    """The late step: the cut ahead is still writing (its records, its appends) when the prepare
    comes. The prepare waits for it, reports it, and its events are below the seal."""
    backend = LocalBackend(seed=7, token_delay_s=0.01)
    async with rig_for(log, bus_config, tmp_path, backend) as rig:
        await log.dispatch("r1", {}, instance="collector")
        call = await _generating(rig, "r1", 5)
        _steady(rig)
        inflight = rig.service._inflight
        held = asyncio.Event()
        put = rig.service.writes.put

        async def slow_put(*args: Any, **kw: Any) -> Any:
            await held.wait()  # the cut ahead's record write, held until the prepare is waiting
            return await put(*args, **kw)

        rig.service.writes.put = slow_put  # type: ignore[method-assign]
        writing = asyncio.ensure_future(inflight.cut_ahead())
        await until(lambda: inflight._writing.locked(), what="the cut ahead writing")
        checkpoint = asyncio.ensure_future(rig.coordinator.checkpoint(deadline_s=10))
        await until(lambda: inflight._prepares == 1, what="the prepare waiting on the cut ahead")
        assert not checkpoint.done()
        held.set()
        rig.service.writes.put = put  # type: ignore[method-assign]
        assert await writing == 1
        res = await checkpoint
        [ahead] = await _cuts(log, "r1")
        assert ahead.seq < res.record.cut and res.record.quarantined == {}
        backend.token_delay_s = 0.0
        assert (await call).status_code == 200


async def test_a_crash_after_a_cut_ahead_restores_from_the_checkpoint_before_it(
    log: EventLog, bus_config: BusConfig, tmp_path: Any
) -> None:
    """A cut ahead that no checkpoint sealed is above every published cut: a crash then restores
    from the checkpoint before it, whose own cut the continuation takes."""
    backend = LocalBackend(seed=7, token_delay_s=0.01)
    async with rig_for(log, bus_config, tmp_path, backend) as rig:
        await log.dispatch("r1", {}, instance="collector")
        call = await _generating(rig, "r1", 5)
        res = await rig.coordinator.checkpoint(deadline_s=10)
        [at_prepare] = await _cuts(log, "r1")
        await until(lambda: _emitted(rig) > at_prepare.event.token_boundary, what="tokens past the cut")
        assert await rig.service._inflight.cut_ahead() == 1
        ahead = (await _cuts(log, "r1"))[-1]
        assert ahead.seq > res.record.cut and ahead.event.token_boundary > at_prepare.event.token_boundary
        again = await _restored(rig, backend, call, res)
    _exact(again, backend, at_prepare.event.token_boundary)


async def test_checkpoints_at_a_steady_period_are_cut_ahead_and_restore_exactly(
    log: EventLog, bus_config: BusConfig, tmp_path: Any
) -> None:
    """The schedule itself: a server that sees prepares every 0.4 s cuts its running call a lead
    before the next is due, by its own clock; a restore from the checkpoint after is exact."""
    backend = LocalBackend(seed=7, token_delay_s=0.05)
    async with rig_for(log, bus_config, tmp_path, backend) as rig:
        await log.dispatch("r1", {}, instance="collector")
        call = await _generating(rig, "r1", 1)
        loop = asyncio.get_running_loop()
        start, k = loop.time(), 0
        while rig.service.stats["cuts_ahead"] == 0:
            assert not call.done() and k < 30, "no cut was taken ahead of a steady checkpoint"
            k += 1
            await asyncio.sleep(max(0.0, start + 0.4 * k - loop.time()))  # the collection's schedule
            res = await rig.coordinator.checkpoint(deadline_s=10)
        res = await rig.coordinator.checkpoint(deadline_s=10)
        again = await _restored(rig, backend, call, res)
    assert again["rollcut"]["continued_from"] > 0
    assert again["choices"][0]["message"]["generation_token_ids"] == backend.plan(BODY).output_ids
