"""`rollcut collect` on a three-node cluster whose network splits (issue 34).

Each nats-server node runs on a host of its own (a network namespace, ``tests/hosts.py``), with
its own address; cluster routes and every client cross a bridge, not loopback. The collector and
every Gym server run as processes on one more host (this namespace). The faults are the network's:
a node's link taken down, one direction of traffic between two nodes dropped, the collector's host
cut off from the whole cluster. Each trial checks what the node-kill trials check
(``faults.exactly_once``): the exit code from the table, every rollout's row once, every
acknowledgement at its sequence in the stream after healing, the newest checkpoint verifies.

Lossy and slow links: this kernel has no ``sch_netem``, so the links are shaped in user space
(``rollcut.testing.Hosts.shape``: TUN devices and a shaper process, docs/cluster.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rollcut._home import credentials_for
from rollcut.bus import EmbeddedCluster
from rollcut.demo import DEMO_NAMESPACE as NS
from rollcut.demo import demo_tasks
from rollcut.testing import LinkShape

from ..cluster import ACK_JOURNAL_ENV, leader
from ..hosts import Hosts, hosts_available, netns_cluster
from .conftest import Deployment, deploy
from .faults import collect_through, creds_of, exactly_once, rows_grow, slurm_job

pytestmark = pytest.mark.slow

ROLLOUTS = 32
NODES = ["n1", "n2", "n3"]
Split = tuple[Deployment, EmbeddedCluster, Hosts]


@pytest.fixture
def split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Split]:
    monkeypatch.setenv(ACK_JOURNAL_ENV, str(tmp_path / "acks"))
    creds = credentials_for(tmp_path / "nats", NS)
    hosts_available()
    with Hosts(NODES) as hosts:
        cluster = netns_cluster(hosts, tmp_path / "nats", creds).start()
        try:
            with deploy(
                tmp_path, demo_tasks(ROLLOUTS, seed=1), nats=cluster, replicas=3, token_delay=0.01
            ) as dep:
                dep.every_s = 1.0
                dep.extra_config = ["compaction:", "  enabled: false"]
                dep._write_config()
                yield dep, cluster, hosts
        finally:
            cluster.kill()


Move = Callable[[Hosts, str, str], None]
"""A change to the network, given the stream leader's and one follower's names."""


def _split_while_collecting(split: Split, apply: Move, undo: Move) -> None:
    """``apply`` once the collection is under way, ``undo`` once it has written 3 more rows, then what
    every fault trial checks (``faults.collect_through``)."""
    dep, cluster, hosts = split

    def fault() -> None:
        lead = leader(cluster, creds_of(dep))
        follower = next(n for n in cluster.nodes if n is not lead)
        apply(hosts, lead.name, follower.name)
        rows_grow(dep, 3)
        undo(hosts, lead.name, follower.name)

    collect_through(dep, cluster, fault)


def test_the_stream_leader_cut_off_from_everyone(split: Split) -> None:
    """The majority elects a leader and goes on; the old one, healed, rejoins as a follower and takes
    nothing it accepted alone (it could accept nothing: no quorum)."""
    _split_while_collecting(split, lambda h, lead, _: h.cut(lead), lambda h, lead, _: h.heal(lead))


def test_one_node_alone_while_the_majority_goes_on_and_heals_under_checkpoints(split: Split) -> None:
    """A follower in a minority of one; healed while checkpoints run every second."""
    _split_while_collecting(split, lambda h, _, alone: h.cut(alone), lambda h, _, alone: h.heal(alone))


def test_an_asymmetric_split_where_the_leader_hears_a_follower_that_does_not_hear_it(split: Split) -> None:
    """Everything one follower sends to the leader is dropped; the leader's packets still arrive."""
    _split_while_collecting(
        split, lambda h, lead, deaf: h.block(deaf, lead), lambda h, lead, deaf: h.unblock(deaf, lead)
    )


def test_lossy_slow_links_between_every_node_and_to_the_collectors_host(split: Split) -> None:
    """Every link of the cluster, and each node's link to the collector's host, made lossy, slow and
    reordering once the collection is under way (1 % loss, 40 ms one way with 20 ms of jitter), then
    worse (5 % loss, 5 % duplicated) while 3 more rows are written, then clean again: what every
    fault trial checks holds (``faults.collect_through``)."""
    dep, cluster, hosts = split
    links = hosts.links()

    def fault() -> None:
        for a, b in links:
            hosts.shape(a, b, LinkShape(loss=0.01, delay_s=0.04, jitter_s=0.02))
        rows_grow(dep, 3)
        for a, b in links:
            hosts.shape(a, b, LinkShape(loss=0.05, duplicate=0.05, delay_s=0.04, jitter_s=0.02))
        rows_grow(dep, 3)
        shaped = hosts.shaper_counts()  # the cluster's traffic did cross the weather
        assert shaped["read"] > 1000 and shaped["dropped"] > 0 and shaped["duplicated"] > 0, shaped
        for a, b in links:
            hosts.shape(a, b, LinkShape())

    collect_through(dep, cluster, fault)


def test_the_collectors_host_cut_off_exits_75_and_the_slurm_requeue_finishes_once(
    split: Split, tmp_path: Path
) -> None:
    """The Slurm recipe with a partition instead of SIGTERM: the job's host (collector and Gym
    servers) loses the whole cluster, which keeps itself. The collection stops once the bus has not
    answered for ``bus_outage_s``, exits 75 naming the outage, the recipe requeues the job, and the
    requeued run (once the network is back) finishes every rollout once."""
    dep, cluster, hosts = split
    dep.extra_config = [*dep.extra_config, "bus_outage_s: 5"]
    dep._write_config()
    job = slurm_job(dep, tmp_path, SLURM_JOB_ID="4343")
    dep.wait_rows(3, job)  # type: ignore[arg-type]
    with hosts.cut_off_here():
        _, err = job.communicate(timeout=240)
    assert job.returncode == 75, err[-2000:]
    assert "stopped: the bus did not answer for " in err
    assert (tmp_path / "scontrol.calls").read_text().split() == ["requeue", "4343"]
    again = slurm_job(dep, tmp_path, SLURM_JOB_ID="4343", SLURM_RESTART_COUNT="1")
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-2000:]
    exactly_once(dep, cluster)
