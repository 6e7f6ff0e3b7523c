"""The collector lease on the real bus: one holder per namespace, taken over only when it is free."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import pytest

from rollcut import CollectorBusyError, RollcutError
from rollcut.bus import CollectorLease, EventLog
from rollcut.collect import NamespaceLease


def _held(instance: str, *, host: str, pid: int, ttl_s: float, left_s: float) -> CollectorLease:
    """A lease record as another collector would have written it."""
    return CollectorLease(
        component="collector",
        instance=instance,
        collection=f"{instance}-collection",
        host=host,
        pid=pid,
        ttl_s=ttl_s,
        expires_at=time.time() + left_s,
    )


async def test_a_second_collector_is_refused_naming_the_holder_until_it_releases(log: EventLog) -> None:
    first = NamespaceLease(log, instance="c1")
    await first.acquire()
    second = NamespaceLease(log, instance="c2")
    with pytest.raises(CollectorBusyError) as busy:
        await second.acquire()
    err = busy.value
    assert (err.holder, err.host, err.pid) == (first.collection, socket.gethostname(), os.getpid())
    assert err.namespace == log.subjects.namespace and "c1" in str(err)
    await first.release()
    await second.acquire()  # released: free at once
    await second.release()


async def test_of_collectors_starting_together_exactly_one_holds_the_lease(log: EventLog) -> None:
    leases = [NamespaceLease(log, instance=f"c{i}") for i in range(6)]
    outcomes = await asyncio.gather(*(lease.acquire() for lease in leases), return_exceptions=True)
    assert sum(o is None for o in outcomes) == 1
    assert all(isinstance(o, CollectorBusyError) for o in outcomes if o is not None)
    for lease in leases:
        await lease.release()


async def test_a_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(log: EventLog) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = _held("crashed", host=socket.gethostname(), pid=int(gone.stdout), ttl_s=3600, left_s=3600)
    await log.append_expecting(dead, 0)
    lease = NamespaceLease(log, instance="resumed")
    await lease.acquire()  # a SIGKILLed collector run again need not wait out its own lease
    await lease.release()


async def test_a_dead_holders_lease_read_behind_its_end_is_still_taken_over(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in CI: the requeue of a collection stopped by a bus outage read the lane from a replica
    just back from it, one renewal behind. Its set at that end failed, and the lease was refused as
    held by the dead collector it had just seen was gone. Now the lane is read again and taken."""
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = _held("crashed", host=socket.gethostname(), pid=int(gone.stdout), ttl_s=3600, left_s=3600)
    first = await log.append_expecting(dead, 0)
    assert first is not None
    lane = log.subjects.mark("collector")
    behind = await log.last_on(lane)  # what a replica one renewal behind will answer
    renewal = _held("crashed", host=socket.gethostname(), pid=int(gone.stdout), ttl_s=3600, left_s=3600)
    assert await log.append_expecting(renewal, first) is not None  # its last renewal
    real = log.last_on
    reads = []

    async def once_behind(subject: str, **kw: bool) -> object:
        reads.append(subject)
        return behind if len(reads) == 1 else await real(subject, **kw)

    monkeypatch.setattr(log, "last_on", once_behind)
    lease = NamespaceLease(log, instance="requeued")
    await lease.acquire()
    assert reads == [lane, lane] and lease.seq > first + 1
    await lease.release()


async def test_a_live_lease_of_another_host_is_respected_until_it_expires(log: EventLog) -> None:
    other = _held("elsewhere", host="another-host", pid=1, ttl_s=3600, left_s=3600)
    seq = await log.append_expecting(other, 0)
    with pytest.raises(CollectorBusyError, match="another-host"):
        await NamespaceLease(log, instance="me").acquire()
    expired = _held("elsewhere", host="another-host", pid=1, ttl_s=1, left_s=-1)
    assert seq is not None and await log.append_expecting(expired, seq) is not None
    lease = NamespaceLease(log, instance="me")
    await lease.acquire()
    await lease.release()


async def test_a_holder_whose_lease_is_taken_over_is_told_to_stop(log: EventLog) -> None:
    lost: asyncio.Future[RollcutError] = asyncio.get_running_loop().create_future()
    holder = NamespaceLease(log, instance="slow", ttl_s=0.3, on_lost=lost.set_result)
    await holder.acquire()
    usurper = _held("usurper", host="another-host", pid=1, ttl_s=60, left_s=60)
    assert await log.append_expecting(usurper, holder.seq) is not None
    err = await asyncio.wait_for(lost, 10)  # the next renewal finds the lane moved
    assert isinstance(err, CollectorBusyError) and "taken over" in str(err)
    await holder.release()
    last = await log.last_on(log.subjects.mark("collector"))
    assert last is not None and isinstance(last.event, CollectorLease) and last.event.instance == "usurper"


async def test_a_release_that_meets_a_renewal_in_flight_still_frees_the_namespace(log: EventLog) -> None:
    # a renewal every millisecond: a release often lands while one is being appended. Cancelling the renewer
    # there let the renewal land with its sequence lost, and the release, expecting the old one, left
    # the lease held for a whole TTL (CI saw the gemma demo's next phase refused)
    for i in range(200):
        holder = NamespaceLease(log, instance=f"h{i}", ttl_s=0.5, renew_every_s=0.001)
        await holder.acquire()
        await asyncio.sleep((i % 7) * 0.0007)
        await holder.release()
        successor = NamespaceLease(log, instance=f"s{i}", ttl_s=3600)
        await successor.acquire()  # free at once, not after the holder's TTL
        await successor.release()
