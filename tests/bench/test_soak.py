"""``rollcut bench soak``: a collection with compaction, sampled as it goes. Its figures only mean
something if it wrote every row, so its exit says whether it did; and one compaction that fails
(a purge the server did not answer in time, on a loaded machine) must cost that compaction only, not
every checkpoint after it."""

from __future__ import annotations

from typing import Any

import pytest

from rollcut import BusError
from rollcut.bench import bench_soak
from rollcut.cli._bench import soak_exit
from rollcut.collect import _checkpointing

ROLLOUTS = 1500


async def test_an_instant_soak_writes_every_row_compacts_and_exits_0() -> None:
    out = await bench_soak(rollouts=ROLLOUTS, cluster=1, instant=True, checkpoint_every_s=0.3, sample_s=0.5)
    assert out["written"] == ROLLOUTS and out["unwritten"] == 0 and out["bus_outage"] is None, out["failed"]
    assert out["compacted_rollouts"] > 0 and out["compactions_failed"] == 0
    # the samples the memory figures come from were taken, through to the last row
    assert out["samples"] and out["samples"][-1]["rows"] == ROLLOUTS
    assert soak_exit(out) == 0


async def test_a_failed_compaction_is_counted_and_the_checkpoints_and_compactions_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = _checkpointing.compact
    calls = 0

    async def first_fails(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise BusError("a purge got no answer for 60 s (injected)", subject="rc.soak.ev.t0-0.*.model")
        return await real(*args, **kwargs)

    monkeypatch.setattr(_checkpointing, "compact", first_fails)
    out = await bench_soak(rollouts=ROLLOUTS, cluster=1, instant=True, checkpoint_every_s=0.3, sample_s=0.5)
    assert out["written"] == ROLLOUTS and out["unwritten"] == 0, out["failed"]
    assert out["compactions_failed"] == 1 and calls > 1
    # a later compaction did the work, and cleared what the failed one had said
    assert out["compacted_rollouts"] > 0 and "compaction" not in out["failed"]
    assert out["checkpoints_published"] >= calls


def _figures(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"rollouts": 10, "written": 10, "unwritten": 0, "bus_outage": None, "failed": {}}
    return base | over


def test_a_soak_that_did_not_write_every_row_does_not_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert soak_exit(_figures()) == 0
    stopped = _figures(written=3, unwritten=7, bus_outage="the bus was declared gone")
    assert soak_exit(stopped) == 74
    short = _figures(written=8, unwritten=2, failed={"t3-0": "environment unreachable: ReadError('')"})
    assert soak_exit(short) == 1
    said = capsys.readouterr().err
    assert "3/10 rows" in said and "2 rollouts without a row" in said and "t3-0" in said
