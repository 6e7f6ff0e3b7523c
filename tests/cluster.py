"""A three-node JetStream cluster on loopback for tests, and the checks every cluster fault test makes.

The nodes are real nats-server processes (``rollcut.bus.EmbeddedCluster``); killing one is SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors

from rollcut.bus import BusConfig, Credentials, EmbeddedCluster, EventLog, Subjects, login_options
from rollcut.bus._commit import ACK_JOURNAL_ENV
from rollcut.testing import acked, missing_acks, stream_leader

__all__ = [
    "ACK_JOURNAL_ENV",
    "acked",
    "acks_told",
    "append_refused",
    "journal_env",
    "leader",
    "missing_acks",
    "stream_health",
]


def acks_told(journal: Path) -> int:
    """How many acknowledgements the writers have been given so far."""
    return len(acked(journal)) if journal.exists() else 0


async def _info(url: str, creds: Credentials) -> tuple[str, list[tuple[str, bool, int]]]:
    log = await EventLog.connect(BusConfig(url=url).as_role(creds, "admin"))
    try:
        info = await log.nc.jetstream().stream_info(log.stream)
        cl = info.cluster
        assert cl is not None
        peers = [(p.name, bool(p.current), int(p.lag or 0)) for p in cl.replicas or []]
        return str(cl.leader or ""), peers
    finally:
        await log.close()


def leader(cluster: EmbeddedCluster, creds: Credentials) -> Any:
    """The node that leads the namespace's stream now (after an election, the new one)."""
    return stream_leader(cluster, creds)


def stream_health(cluster: EmbeddedCluster, creds: Credentials) -> list[tuple[str, bool, int]]:
    """Each follower of the stream: its name, whether it is current, and how far behind it is."""
    return asyncio.run(_info(cluster.url, creds))[1]


def journal_env(path: Path) -> dict[str, str]:
    return {**os.environ, ACK_JOURNAL_ENV: str(path)}


async def _append_refused(url: str, creds: Credentials) -> str:
    login = login_options(BusConfig(url=url).as_role(creds, "admin"))
    nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, **login)
    try:
        subject = Subjects(creds.namespace).mark("quorum-probe")
        try:
            ack = await nc.jetstream().publish(subject, b"", timeout=3)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.Error) as exc:
            return repr(exc)
        raise AssertionError(f"an append was acknowledged without a quorum: {ack}")
    finally:
        await nc.close()


def append_refused(node: Any, creds: Credentials) -> str:
    """An append to the namespace's stream through ``node`` is not acknowledged (the node is what is
    left of a cluster without a quorum): what the server answered instead. Raises if it was."""
    return asyncio.run(_append_refused(node.url, creds))
