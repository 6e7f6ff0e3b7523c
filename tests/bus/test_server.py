"""The embedded nats-server: version floor, readiness, and crash durability."""

from __future__ import annotations

import asyncio
import contextlib
import stat
from pathlib import Path

import pytest

from rollcut import ServerVersionError
from rollcut.bus import BusConfig, EmbeddedServer, EventLog

from ..helpers import model_event


def test_server_older_than_floor_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "nats-server"
    fake.write_text("#!/bin/sh\necho 'nats-server: v2.10.4'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(ServerVersionError, match=r"2\.10\.4.*2\.12\.0"):
        EmbeddedServer(tmp_path / "data", binary=str(fake)).start()


def test_embedded_server_binds_loopback_on_a_free_port(tmp_path: Path) -> None:
    with EmbeddedServer(tmp_path) as a, EmbeddedServer(tmp_path / "b") as b:
        assert a.url.startswith("nats://127.0.0.1:") and a.port != b.port
        assert a.version is not None and a.version >= (2, 12, 0)


@pytest.mark.slow
async def test_sigkilled_server_loses_no_acknowledged_event(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path / "nats").start()
    port = server.port
    cfg = BusConfig(url=server.url, namespace="crash", request_timeout_s=2.0)
    log = await EventLog.connect(cfg)
    rollouts = [f"r{i}" for i in range(8)]
    for r in rollouts:
        await log.dispatch(r, {"r": r}, instance="c")
    acked: dict[str, int] = {}
    enough = asyncio.Event()

    async def writer(r: str) -> None:
        i = 0
        while True:
            ev = model_event(r, call_id=f"{r}-{i}")
            seq = await log.append(ev)
            acked[ev.event_id] = seq
            i += 1
            if len(acked) >= 3000:
                enough.set()

    tasks = [asyncio.create_task(writer(r)) for r in rollouts for _ in range(16)]
    await asyncio.wait_for(enough.wait(), 120)
    server.kill()  # SIGKILL while appends are in flight
    snapshot = dict(acked)
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(BaseException):
            await t
    with contextlib.suppress(Exception):
        await asyncio.wait_for(log.close(), 5)

    restarted = EmbeddedServer(tmp_path / "nats", port=port).start()
    try:
        log2 = await EventLog.connect(BusConfig(url=restarted.url, namespace="crash"))
        stored = {s.event.event_id: s.seq async for s in log2.read()}
        await log2.close()
    finally:
        restarted.stop()
    missing = {k: v for k, v in snapshot.items() if stored.get(k) != v}
    assert len(snapshot) >= 3000
    assert missing == {}
