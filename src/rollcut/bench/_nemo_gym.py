"""``rollcut bench nemo-gym``: what continuing a NeMo Gym session by replay costs, against a codec.

The same session twice in one run: NeMo Gym's own ``example_session_state_mgmt`` server,
unmodified, behind rollcut's journal (its session rebuilt at the cut by seeding a fresh upstream
session and giving it every journaled call, each answer compared), and rollcut's port of it
(``stateful_counter``: its state read back from the log, no call made again). Each is seeded, given
``calls`` increments and reads, cut, and restored as the next attempt; reported: the restore's time
per journaled call of each, and the replay's time over the port's, per repeat (their spread).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from .._telemetry import percentile
from ..bus import BusConfig, EmbeddedServer, EventLog
from ..gym.resources import (
    Environment,
    NemoGym,
    NemoGymServer,
    ResourcesService,
    StatefulCounter,
    install_nemo_gym,
)
from ..gym.wire import Identity

__all__ = ["bench_nemo_gym"]

SERVER = "example_session_state_mgmt"
SEED = {"responses_create_params": {"input": []}, "initial_count": 1}


async def _restore_s(log: EventLog, env: Environment, rid: str, calls: int) -> float:
    """Seconds to rebuild, as attempt 2, a session given ``calls`` tool calls in attempt 1."""
    service = ResourcesService(log, env, instance=f"bench-{env.name}")
    first = Identity(rid, 1)
    await log.dispatch(rid, {}, instance="bench")
    await service.seed(first, SEED)
    for i in range(calls):
        name, args = ("increment_counter", {"count": 1}) if i % 2 == 0 else ("get_counter_value", {})
        await service.tool(first, name, args)
    cut = await log.last_seq()
    await log.supersede(rid, 1, instance="bench", checkpoint_id="bench", from_cut=cut)
    t0 = time.perf_counter()
    await service.restore("bench", cut, rollouts=[rid])
    took = time.perf_counter() - t0
    restored = service.sessions.get(Identity(rid, 2))
    assert restored is not None and restored.revision == calls, f"{env.name}: {rid} was not restored"
    service.close_all()
    return took


async def bench_nemo_gym(*, calls: int = 50, repeat: int = 3) -> dict[str, Any]:
    """Per-call restore time of NeMo Gym's counter by replay against rollcut's port, in the same run."""
    install_nemo_gym()
    replay: list[float] = []
    codec: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="rollcut-benchnemogym-") as tmp,
        EmbeddedServer(Path(tmp) / "nats") as nats,
        NemoGymServer(SERVER, log=Path(tmp) / "upstream.log") as upstream,
    ):
        log = await EventLog.connect(BusConfig(url=nats.url, namespace="benchnemogym"))
        try:
            nemo = NemoGym(SERVER, upstream.url, level="event_sourced")
            nemo.discover()
            for r in range(repeat):
                replay.append(await _restore_s(log, nemo, f"nemo{r}", calls) / calls * 1000)
                codec.append(await _restore_s(log, StatefulCounter(), f"port{r}", calls) / calls * 1000)
        finally:
            await log.close()
    ratios = [a / b for a, b in zip(replay, codec, strict=True) if b > 0]
    return {
        "calls_per_session": calls,
        "repeats": repeat,
        "replay_ms_per_call": {"p50": percentile(replay, 50, 3), "max": round(max(replay), 3)},
        "ported_codec_ms_per_call": {"p50": percentile(codec, 50, 3), "max": round(max(codec), 3)},
        "replay_over_codec": {
            "median": round(statistics.median(ratios), 2) if ratios else None,
            "min": round(min(ratios), 2) if ratios else None,
            "max": round(max(ratios), 2) if ratios else None,
        },
    }
