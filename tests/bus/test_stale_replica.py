"""A read up to a cut never comes back short from a replica that is behind (issue 34).

Any replica of a stream answers a direct get, and a follower cut off from its peers keeps answering
from what it has, for as long as it is cut off (nats-server subscribes a follower to direct gets
once it is caught up and does not take that back). The trial: a follower on a host of its own loses
its peers but not its clients; more is appended through the other two; a client of that follower
alone reads up to the leader's last sequence. A bare page scan comes back short (the hazard is real
here), or, seen once in CI, is not answered at all; rollcut's read either returns all of it or
fails, and once the follower is back it returns all of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollcut._errors import BusError
from rollcut.bus import BusConfig, Credentials, EmbeddedCluster, EventLog
from rollcut.bus._read import scan
from rollcut.bus._stream import connect

from ..cluster import leader, stream_health
from ..helpers import counter_event, until
from ..hosts import Hosts, hosts_available, netns_cluster

pytestmark = pytest.mark.slow

NS = "stale"
NODES = ["n1", "n2", "n3"]


@pytest.fixture
def split(tmp_path: Path) -> Iterator[tuple[EmbeddedCluster, Hosts, Credentials]]:
    hosts_available()
    creds = Credentials.generate(NS)
    with Hosts(NODES) as hosts:
        cluster = netns_cluster(hosts, tmp_path / "nats", creds).start()
        try:
            yield cluster, hosts, creds
        finally:
            cluster.kill()


async def _append(url: str, creds: Credentials, rollouts: range) -> int:
    log = await EventLog.connect(BusConfig(url=url, replicas=3).as_role(creds, "admin"))
    try:
        for i in rollouts:
            await log.dispatch(f"r{i}", {"id": i}, instance="c")
            await log.append(counter_event(f"r{i}", 2, 1))
        return await log.last_seq()
    finally:
        await log.close()


async def _reader(url: str, creds: Credentials) -> EventLog:
    """A log on one node's URL alone, without asking for the stream (its leader may be unreachable)."""
    config = BusConfig(url=url, replicas=3, outage_s=3.0).as_role(creds, "agent")
    return EventLog(await connect(config), config, owns_connection=True)


def test_a_read_through_a_replica_that_is_behind_is_whole_or_fails(
    split: tuple[EmbeddedCluster, Hosts, Credentials],
) -> None:
    cluster, hosts, creds = split
    asyncio.run(_append(cluster.url, creds, range(10)))
    lead = leader(cluster, creds)
    behind = next(n for n in cluster.nodes if n is not lead)

    async def current() -> bool:
        return all(ok and lag == 0 for _, ok, lag in await asyncio.to_thread(stream_health, cluster, creds))

    asyncio.run(until(current, timeout=60, what="every follower caught up"))
    peers = [n.name for n in cluster.nodes if n is not behind]
    for peer in peers:  # its peers are gone for it, its clients are not
        hosts.block(behind.name, peer)
        hosts.block(peer, behind.name)
    others = ",".join(f"nats://{hosts.addr[p]}:4222" for p in peers)
    last = asyncio.run(_append(others, creds, range(10, 30)))
    one = f"nats://{hosts.addr[behind.name]}:4222"

    async def through_it() -> tuple[int | None, list[int] | BusError]:
        log = await _reader(one, creds)
        try:
            try:  # short, or unanswered: seen once in CI, a direct get through it timed out from seq 1
                bare: int | None = sum([len(pg) async for pg in scan(log.nc, log.stream, up_to=last)], 0)
            except BusError:
                bare = None
            try:
                return bare, [s.seq async for s in log.read(up_to=last, strict=False)]
            except BusError as exc:  # a page or the leader not answered through the follower
                return bare, exc
        finally:
            await log.close()

    tries = [asyncio.run(through_it()) for _ in range(3)]
    # the follower serves what it has: a bare scan is short (or not answered), never the whole
    assert any(bare is None or bare < last for bare, _ in tries), tries
    for _, read in tries:  # rollcut's read: whole, or an error; never part of the history
        assert isinstance(read, BusError) or read == list(range(1, last + 1)), read
    for peer in peers:
        hosts.unblock(behind.name, peer)
        hosts.unblock(peer, behind.name)

    async def whole() -> bool:
        log = await _reader(one, creds)
        try:
            return [s.seq async for s in log.read(up_to=last, strict=False)] == list(range(1, last + 1))
        except BusError:
            return False
        finally:
            await log.close()

    asyncio.run(until(whole, timeout=60, what="a whole read through the follower once it is back"))
