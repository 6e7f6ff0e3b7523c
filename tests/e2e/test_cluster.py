"""`rollcut collect` on a three-node JetStream cluster while its nodes fail: real nats-server
processes SIGKILLed, restarted, wiped; every Gym server and the collector are processes too.

Each test checks what an operator would: the collection finishes (or stops as documented), every
rollout has exactly one row, checkpoints kept publishing through the fault, and every append any
writer was told was stored is in the stream at the sequence it was told (the writers' ack journals,
``ROLLCUT_ACK_JOURNAL``, against the stream after the run).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollcut._home import credentials_for
from rollcut.bus import EmbeddedCluster
from rollcut.demo import DEMO_NAMESPACE as NS
from rollcut.demo import demo_tasks

from ..cluster import ACK_JOURNAL_ENV, append_refused, leader, stream_health
from ..helpers import until
from .conftest import SIGTERM, Deployment, deploy, finish
from .faults import collect_through, creds_of, exactly_once, rows_grow

pytestmark = pytest.mark.slow

ROLLOUTS = 32
OnCluster = tuple[Deployment, EmbeddedCluster]


@pytest.fixture
def on_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OnCluster]:
    monkeypatch.setenv(ACK_JOURNAL_ENV, str(tmp_path / "acks"))  # every process this test starts keeps one
    creds = credentials_for(tmp_path / "nats", NS)
    cluster = EmbeddedCluster(tmp_path / "nats", size=3, credentials=creds).start()
    try:
        tasks = demo_tasks(ROLLOUTS, seed=1)
        with deploy(tmp_path, tasks, nats=cluster, replicas=3, token_delay=0.01) as dep:
            dep.every_s = 1.0
            # every acknowledged append must be found in the stream afterwards: nothing compacted away
            dep.extra_config = ["compaction:", "  enabled: false"]
            dep._write_config()
            yield dep, cluster
    finally:
        cluster.kill()


def test_a_follower_then_the_stream_leader_killed(on_cluster: OnCluster) -> None:
    dep, cluster = on_cluster
    creds = creds_of(dep)

    def fault() -> None:
        lead = leader(cluster, creds)
        follower = next(n for n in cluster.nodes if n is not lead)
        follower.kill()
        rows_grow(dep, 3)  # the collection goes on with two of three
        follower.start()
        lead = leader(cluster, creds)
        lead.kill()  # a new leader is elected under running appends
        rows_grow(dep, 3)
        lead.start()

    collect_through(dep, cluster, fault)


def test_a_rolling_restart_of_all_three_nodes(on_cluster: OnCluster) -> None:
    dep, cluster = on_cluster
    creds = creds_of(dep)

    def fault() -> None:
        for node in cluster.nodes:
            node.stop()  # SIGTERM: the node leaves as an operator's restart makes it
            node.start()

            async def rejoined(name: str = node.name) -> bool:
                peers = await asyncio.to_thread(stream_health, cluster, creds)
                lead = await asyncio.to_thread(leader, cluster, creds)
                return bool(lead.name == name or any(p == name and ok for p, ok, _ in peers))

            asyncio.run(until(rejoined, timeout=60, what=f"{node.name} back in the stream's group"))

    collect_through(dep, cluster, fault)


def test_two_nodes_down_stalls_the_collection_until_quorum_returns(
    on_cluster: OnCluster,
) -> None:
    dep, cluster = on_cluster
    creds = creds_of(dep)

    def fault() -> None:
        cluster.nodes[0].kill()
        cluster.nodes[1].kill()
        # what is left stores nothing: an append through it is answered with a refusal or nothing
        # (seen, not inferred from a quiet interval); the collection's own appends wait meanwhile
        assert append_refused(cluster.nodes[2], creds)
        cluster.nodes[0].start()
        cluster.nodes[1].start()

    collect_through(dep, cluster, fault)


def test_a_wiped_node_catches_up_and_nothing_is_lost(on_cluster: OnCluster) -> None:
    dep, cluster = on_cluster
    creds = creds_of(dep)
    wiped: list[str] = []

    def fault() -> None:
        node = next(n for n in cluster.nodes if n is not leader(cluster, creds))
        node.kill()
        cluster.wipe(cluster.nodes.index(node))
        wiped.append(node.name)
        rows_grow(dep, 2)
        node.start()

    collect_through(dep, cluster, fault)

    async def caught_up() -> bool:
        peers = await asyncio.to_thread(stream_health, cluster, creds)
        return any(p == wiped[0] and ok and lag == 0 for p, ok, lag in peers)

    asyncio.run(until(caught_up, timeout=60, what="the wiped node to catch up"))


def test_sigterm_on_a_cluster_checkpoints_exits_75_and_resume_finishes(
    on_cluster: OnCluster,
) -> None:
    dep, _ = on_cluster
    proc = dep.collect()
    dep.wait_rows(3, proc, timeout=120)
    proc.send_signal(SIGTERM)
    code, summary = finish(proc)
    assert code == 75 and summary["checkpoints_published"] >= 1
    code, summary = finish(dep.collect("--resume"), timeout=300)
    assert code == 0, summary
    dep.each_rollout_once()


def test_a_bus_without_quorum_stops_the_collection_with_75_and_the_requeue_finishes_once(
    on_cluster: OnCluster,
) -> None:
    """Two of three nodes gone for good: the collection does not wait out every stalled request and
    end with 74 ("storage failed"); it stops once the bus has not answered for ``bus_outage_s``, exits
    75 naming the outage, and the requeued job finishes with every row once, nothing acknowledged lost."""
    dep, cluster = on_cluster
    dep.extra_config = [*dep.extra_config, "bus_outage_s: 5"]
    dep._write_config()
    proc = dep.collect()
    dep.wait_rows(3, proc, timeout=120)
    cluster.nodes[0].kill()
    cluster.nodes[1].kill()
    code, summary = finish(proc, timeout=240)
    assert code == 75, summary
    assert summary["bus_outage"].startswith("the bus did not answer for ")
    assert summary["interrupted"] and len(summary["pending"]) > 0
    assert summary["results_written"] + len(summary["pending"]) == dep.rollouts
    cluster.nodes[0].start()
    cluster.nodes[1].start()
    code, summary = finish(dep.collect("--resume"), timeout=300)
    assert code == 0, summary
    exactly_once(dep, cluster)
