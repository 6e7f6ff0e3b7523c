"""``rollcut bench chaos``: many short collections on a three-node cluster, each hit by one fault
drawn at random at a random moment, and the invariants checked after every one.

A trial is a real deployment (three nats-server processes, every Gym server a process, ``rollcut
collect`` a process), torn down after. Its fault is one of :data:`FAULTS`: node and leader kills,
an agent worker killed (its parent starts it again), and, where hosts can be made (root and
iproute2: every node on a network namespace of its own), the stream leader or a follower cut off,
an asymmetric split, the collector's host cut off from the cluster for a random time (past
``bus_outage_s`` the collection stops with 75 and is requeued), and every link lossy, slow and
duplicating (``Hosts.shape``: 1-20 % loss, 50-500 ms one way). After it:

- ``exit``: the collection ended 0, or 75 and then its requeue (``--resume``) 0; nothing else;
- ``rows``: every rollout has exactly one row;
- ``acks``: every acknowledgement any process was told is in the stream at that sequence;
- ``generated``: no model call that completed was generated again (same rollout, same request);
- ``verify``: the newest checkpoint verifies against the stream and the token store (a collection
  that ended before any checkpoint published has none to verify: counted as ``no_checkpoint``).

A violation is counted per fault kind and invariant, with the trial's seed and what was seen, so
that a trial can be run again alone (``--seed``, ``--trials 1``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._home import credentials_for
from .._process import lifeline
from ..bus import BusConfig, Credentials, EmbeddedCluster, EventLog
from ..bus._commit import ACK_JOURNAL_ENV
from ..demo import DEMO_NAMESPACE as NS
from ..demo import demo_tasks
from ..ledger import Ledger
from ..testing import (
    Hosts,
    LinkShape,
    ServerProcess,
    generated_twice,
    hosts_possible,
    missing_acks,
    netns_cluster,
    start_stack,
    stream_leader,
)

__all__ = ["FAULTS", "bench_chaos"]

NODE_FAULTS = ("node_kill", "leader_kill", "agent_worker_kill")
NET_FAULTS = ("leader_cut", "follower_cut", "asymmetric", "collector_cut", "lossy_links")
FAULTS = NODE_FAULTS + NET_FAULTS
"""Every fault kind; the network ones only where hosts can be made."""
INVARIANTS = ("exit", "rows", "acks", "generated", "verify")


def bench_chaos(
    *, trials: int = 10, rollouts: int = 8, seed: int = 0, faults: tuple[str, ...] = FAULTS
) -> dict[str, Any]:
    """``trials`` trials, one fault each (every kind once per round of as many trials as there are
    kinds, in a random order), at a random moment for a random time; violations per fault kind and
    invariant."""
    why_not = hosts_possible()
    kinds = [f for f in faults if f in NODE_FAULTS or why_not is None]
    if not kinds:
        raise ValueError(f"no fault kind can run here: {why_not}")
    rng = random.Random(seed)
    per: dict[str, dict[str, Any]] = {}
    failures: list[dict[str, Any]] = []
    t0 = time.monotonic()
    order: list[str] = []
    for _ in range(trials):
        if not order:  # every kind once per round, in a random order: each is tried as often
            order = rng.sample(kinds, len(kinds))
        kind, trial_seed = order.pop(), rng.randrange(1 << 30)
        with tempfile.TemporaryDirectory(prefix="rollcut-chaos-") as tmp:
            seen = _trial(Path(tmp), kind, trial_seed, rollouts)
        row = per.setdefault(
            kind, {"trials": 0, "requeued": 0, "no_checkpoint": 0, "violations": dict.fromkeys(INVARIANTS, 0)}
        )
        row["trials"] += 1
        row["requeued"] += int(seen["exits"][:1] == [75])
        row["no_checkpoint"] += int(seen.get("no_checkpoint", False))
        for name in seen["violated"]:
            row["violations"][name] += 1
        if seen["violated"]:
            failures.append({"fault": kind, "seed": trial_seed, **seen})
    return {
        "trials": trials,
        "rollouts": rollouts,
        "seed": seed,
        "network_faults": why_not or "yes",
        "faults": per,
        "violations": sum(sum(r["violations"].values()) for r in per.values()),
        "failures": failures[:20],
        "wall_s": round(time.monotonic() - t0, 1),
    }


def _trial(root: Path, kind: str, seed: int, rollouts: int) -> dict[str, Any]:
    rng = random.Random(seed)
    creds = credentials_for(root / "nats", NS)
    with contextlib.ExitStack() as undo:
        hosts = undo.enter_context(Hosts(["n1", "n2", "n3"])) if kind in NET_FAULTS else None
        if hosts is not None:  # every node on a host of its own
            cluster = netns_cluster(hosts, root / "nats", creds)
        else:
            cluster = EmbeddedCluster(root / "nats", credentials=creds)
        undo.callback(cluster.kill)
        cluster.start()
        asyncio.run(_open_stream(cluster.url, creds))
        (root / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in demo_tasks(rollouts, seed)))
        creds_file = root / "nats" / "credentials.json"
        stack = start_stack(cluster.url, creds_file, root / "tokens", namespace=NS, replicas=3, seed=seed)
        for server in stack:
            undo.callback(server.close)
        _write_config(root, cluster.url, stack[-1].url)
        env = {**os.environ, ACK_JOURNAL_ENV: str(root / "acks")}
        exits: list[int] = []
        proc = _collect(root, env)
        undo.callback(proc.kill)
        if _rows_reach(root, proc, rng.randint(1, max(1, rollouts // 2))):
            _inject(kind, cluster, creds, stack, hosts, rng)
        exits.append(_wait(proc))
        if exits[-1] == 75:
            exits.append(_wait(_collect(root, env, "--resume")))
        seen: dict[str, Any] = {"exits": exits}
        seen["violated"] = _violations(root, cluster.url, creds, seen, rollouts)
        return seen


async def _open_stream(url: str, creds: Credentials) -> None:
    log = await EventLog.connect(BusConfig(url=url, replicas=3).as_role(creds, "admin"))
    await log.close()


def _write_config(root: Path, url: str, environment: str) -> None:
    lines = [
        f"nats_url: {url}",
        "replicas: 3",
        f"namespace: {NS}",
        f"credentials: {root / 'nats' / 'credentials.json'}",
        f"home: {root}",
        f"environment_url: {environment}",
        "tasks: tasks.jsonl",
        "output: results.jsonl",
        "concurrency: 8",
        "bus_outage_s: 5",
        "checkpoint:",
        "  every_s: 1",
        "  deadline_s: 5",
        "compaction:",  # every acknowledged append must still be in the stream afterwards
        "  enabled: false",
        "",
    ]
    (root / "collect.yaml").write_text("\n".join(lines))


def _collect(root: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "rollcut", "collect", str(root / "collect.yaml"), "--json", *args]
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=lifeline()
    )


def _rows(root: Path) -> list[dict[str, Any]]:
    path = root / "results.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def _rows_reach(root: Path, proc: subprocess.Popen[str], n: int, timeout_s: float = 120.0) -> bool:
    """Whether the collection wrote ``n`` rows while running (False: it ended first)."""
    give_up = time.monotonic() + timeout_s
    while len(_rows(root)) < n and proc.poll() is None and time.monotonic() < give_up:
        time.sleep(0.1)  # the output file grows; there is nothing to wait on but it
    return proc.poll() is None


def _wait(proc: subprocess.Popen[str], timeout_s: float = 300.0) -> int:
    try:
        proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return -9  # a collection that never ended: an exit violation
    return proc.returncode


def _violations(root: Path, url: str, creds: Credentials, seen: dict[str, Any], rollouts: int) -> list[str]:
    """The invariants a trial broke; what was seen of each goes into ``seen``."""
    bad = []
    if seen["exits"] not in ([0], [75, 0]):
        bad.append("exit")
    ids = Counter(r.get("rollout_id") for r in _rows(root))
    if len(ids) != rollouts or max(ids.values(), default=0) != 1:
        bad.append("rows")
        seen["rows"] = {"distinct": len(ids), "most": max(ids.values(), default=0)}
    told, wrong = missing_acks(url, creds, root / "acks")
    if told == 0 or wrong:
        bad.append("acks")
        seen["acks"] = {"told": told, "wrong": wrong[:5]}
    twice = generated_twice(url, creds)
    if twice:
        bad.append("generated")
        seen["generated"] = twice[:5]
    with Ledger(root / "ledger", readonly=True) as led:
        newest = max(led.checkpoints(), key=lambda c: c.cut, default=None)
    if newest is None:  # finished before any checkpoint could publish: nothing to verify, nothing wrong
        seen["no_checkpoint"] = True
        return bad
    why = _unverified(root, url, newest.checkpoint_id)
    if why is not None:
        bad.append("verify")
        seen["verify"] = why
    return bad


def _unverified(root: Path, url: str, checkpoint_id: str) -> str | None:
    """None if the checkpoint verifies, else what ``rollcut checkpoints verify`` said."""
    argv = [sys.executable, "-m", "rollcut", "checkpoints", "verify", checkpoint_id, "--url", url]
    argv += ["--namespace", NS, "--credentials", str(root / "nats" / "credentials.json"), "--home", str(root)]
    done = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=120)
    with contextlib.suppress(ValueError):
        if done.returncode == 0 and json.loads(done.stdout).get("ok"):
            return None
    return f"{checkpoint_id}: exit {done.returncode}: {done.stdout[-1500:]} {done.stderr[-1500:]}"


Heal = Callable[[], object]


def _node_kill(cluster: EmbeddedCluster, creds: Credentials, rng: random.Random, *, leader: bool) -> Heal:
    node = stream_leader(cluster, creds) if leader else rng.choice(cluster.nodes)
    node.kill()
    return node.start


def _worker_kill(stack: list[ServerProcess], rng: random.Random) -> Heal:
    agent = stack[-2]  # start_stack: model, resources..., agent, environment; the agent has 2 workers
    agent.kill_worker(rng.choice(sorted(agent.instances)))  # returns once its parent started it again
    return lambda: None


def _cut(
    hosts: Hosts, cluster: EmbeddedCluster, creds: Credentials, rng: random.Random, *, leader: bool
) -> Heal:
    lead = stream_leader(cluster, creds)
    node = lead if leader else rng.choice([n for n in cluster.nodes if n is not lead])
    hosts.cut(node.name)
    return lambda: hosts.heal(node.name)


def _asymmetric(hosts: Hosts, cluster: EmbeddedCluster, creds: Credentials, rng: random.Random) -> Heal:
    lead = stream_leader(cluster, creds)
    deaf = rng.choice([n for n in cluster.nodes if n is not lead])
    hosts.block(deaf.name, lead.name)  # the follower's packets to the leader are dropped, not the reverse
    return lambda: hosts.unblock(deaf.name, lead.name)


def _collector_cut(hosts: Hosts) -> Heal:
    for name in hosts.ns:
        hosts.block(None, name)

    def heal() -> None:
        for name in hosts.ns:
            hosts.unblock(None, name)

    return heal


def _lossy_links(hosts: Hosts, rng: random.Random) -> Heal:
    """Every link between nodes and from each node to the collector's host made lossy, slow, jittery
    and duplicating, by one draw for the trial (loss 1-20 %, 50-500 ms one way)."""
    delay = rng.uniform(0.05, 0.5)
    weather = LinkShape(
        loss=rng.choice((0.01, 0.05, 0.2)),
        delay_s=delay,
        jitter_s=rng.uniform(0.0, delay / 2),
        duplicate=rng.uniform(0.0, 0.05),
    )
    links = hosts.links()
    for a, b in links:
        hosts.shape(a, b, weather)

    def heal() -> None:
        for a, b in links:
            hosts.shape(a, b, LinkShape())

    return heal


def _inject(
    kind: str,
    cluster: EmbeddedCluster,
    creds: Credentials,
    stack: list[ServerProcess],
    hosts: Hosts | None,
    rng: random.Random,
) -> None:
    """The fault, held for a random time (around ``bus_outage_s`` for the collector's host), then healed."""
    if kind in ("node_kill", "leader_kill"):
        heal = _node_kill(cluster, creds, rng, leader=kind == "leader_kill")
    elif kind == "agent_worker_kill":
        heal = _worker_kill(stack, rng)
    else:
        assert hosts is not None
        if kind in ("leader_cut", "follower_cut"):
            heal = _cut(hosts, cluster, creds, rng, leader=kind == "leader_cut")
        elif kind == "asymmetric":
            heal = _asymmetric(hosts, cluster, creds, rng)
        elif kind == "lossy_links":
            heal = _lossy_links(hosts, rng)
        else:
            heal = _collector_cut(hosts)
    try:
        time.sleep(rng.uniform(2.0, 10.0) if kind == "collector_cut" else rng.uniform(0.5, 4.0))  # the draw
    finally:
        heal()
