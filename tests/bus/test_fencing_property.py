"""Property: whatever the interleaving, no event of an attempt follows its tombstone."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollcut import AttemptConflictError, StaleAttemptError
from rollcut.bus import AttemptOpened, AttemptTombstoned, BusConfig, EventLog, RolloutDispatched

from ..helpers import model_event

_ns = itertools.count()

# An operation: (rollout index, writer's believed attempt offset, op)
ops = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(["append", "append", "append", "supersede"])),
    min_size=1,
    max_size=40,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=ops, groups=st.integers(1, 8))
def test_no_event_of_a_tombstoned_attempt_follows_its_tombstone(nats_url: str, program, groups) -> None:
    asyncio.run(_run(nats_url, program, groups))


async def _run(url: str, program: list[tuple[int, str]], groups: int) -> None:
    cfg = BusConfig(url=url, namespace=f"prop{next(_ns)}", request_timeout_s=5.0)
    # two processes' worth of connections: a writer that learns attempts late, and the restorer
    writer = await EventLog.connect(cfg)
    restorer = await EventLog.connect(cfg)
    try:
        rollouts = [f"r{i}" for i in range(3)]
        for r in rollouts:
            await restorer.dispatch(r, {}, instance="c")
        believed = dict.fromkeys(rollouts, 1)  # what the writer thinks is current
        current = dict.fromkeys(rollouts, 1)
        accepted: dict[str, tuple[str, int]] = {}
        refused: set[str] = set()

        async def append(r: str) -> None:
            ev = model_event(r, attempt=believed[r])
            try:
                await writer.append(ev)
                accepted[ev.event_id] = (r, ev.attempt)
            except StaleAttemptError:
                refused.add(ev.event_id)

        async def supersede(r: str) -> None:
            # a concurrent supersede of the same rollout may win; exactly one does
            with contextlib.suppress(AttemptConflictError):
                await restorer.supersede(r, current[r], instance="coord")

        # run the program in concurrent groups, so appends and tombstones truly interleave
        step = max(1, len(program) // groups)
        for i in range(0, len(program), step):
            chunk = program[i : i + step]
            await asyncio.gather(
                *(append(rollouts[k]) if op == "append" else supersede(rollouts[k]) for k, op in chunk)
            )
            for r in rollouts:
                state = await restorer.fence_state(r)
                assert state is not None and state.open
                current[r] = state.attempt
            # the writer sometimes learns the new attempt, sometimes keeps writing the old one
            for k, _ in chunk[::2]:
                believed[rollouts[k]] = current[rollouts[k]]

        tombstoned_at: dict[tuple[str, int], int] = {}
        stored_ids = set()
        async for s in restorer.read():
            ev = s.event
            if isinstance(ev, AttemptTombstoned):
                tombstoned_at[(ev.rollout_id, ev.attempt)] = s.seq
            elif not isinstance(ev, RolloutDispatched | AttemptOpened):
                stored_ids.add(ev.event_id)
                t = tombstoned_at.get((ev.rollout_id, ev.attempt))
                assert t is None, (
                    f"event of {ev.rollout_id}/{ev.attempt} at {s.seq} after its tombstone at {t}"
                )
        assert stored_ids == set(accepted)
        assert not (stored_ids & refused)
    finally:
        await writer.close()
        await restorer.close()
