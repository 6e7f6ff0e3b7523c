"""A collection's index of rollouts and written rows: the same answers in memory and spilled to disk."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rollcut import ConfigError
from rollcut.collect import _index
from rollcut.collect._index import Inputs

NEMO = {"responses_create_params": {"input": "q"}}


def _tasks(n: int) -> list[dict[str, object]]:
    return [{"id": f"t{i}", "prompt": f"p{i}"} for i in range(n)]


@pytest.fixture(params=["memory", "disk"])
def spill_at(request: pytest.FixtureRequest) -> int:
    return 10**9 if request.param == "memory" else 3


def test_rollouts_come_in_input_order_with_their_rows(tmp_path: Path, spill_at: int) -> None:
    tasks = _tasks(5)
    inputs = Inputs(iter(tasks), 2, near=tmp_path, spill_at=spill_at)  # a stream, read once
    assert inputs.on_disk is (spill_at == 3)
    assert list(inputs) == [f"t{i}-{k}" for i in range(5) for k in range(2)]
    assert len(inputs) == 10 and "t4-1" in inputs and "t5-0" not in inputs and 7 not in inputs
    got = inputs["t3-1"]
    assert (got.row, got.task_index, got.repeat) == (tasks[3], 3, 1)
    with pytest.raises(KeyError):
        inputs["nope-0"]


def test_nemo_rows_are_numbered_as_nemo_gym_numbers_them(tmp_path: Path, spill_at: int) -> None:
    other = {"responses_create_params": {"input": "r"}}
    indexed = {**other, "_ng_task_index": 7}
    inputs = Inputs([NEMO, other, NEMO, indexed], 1, near=tmp_path, spill_at=spill_at)
    # identical rows share a task and number their repeats on; an explicit task index is kept
    assert list(inputs) == ["0-0", "1-0", "0-1", "7-0"]
    assert inputs["0-1"].task_index == 0 and inputs["7-0"].task_index == 7


def test_a_repeated_id_is_refused_naming_both_lines_even_past_the_spill(tmp_path: Path) -> None:
    tasks = [*_tasks(6), {"id": "t1"}]
    with pytest.raises(ConfigError, match="on lines 2 and 7"):
        Inputs(tasks, 1, near=tmp_path, spill_at=3)
    assert not list(tmp_path.glob(".rollcut-index-*"))  # a refused index leaves nothing behind


def test_written_rows_are_kept_once_each(tmp_path: Path, spill_at: int) -> None:
    written = Inputs(_tasks(5), 1, near=tmp_path, spill_at=spill_at).written()
    assert written.add("t1-0", ("d1", 1.0)) and not written.add("t1-0", ("other", 0.0))
    written["t2-0"] = ("d2", 0.5)
    assert dict(written) == {"t1-0": ("d1", 1.0), "t2-0": ("d2", 0.5)} and len(written) == 2
    del written["t1-0"]
    assert "t1-0" not in written and written.get("t1-0") is None
    written.clear()
    assert len(written) == 0


def test_a_disk_index_is_private_and_goes_with_the_collection(tmp_path: Path) -> None:
    inputs = Inputs(_tasks(10), 1, near=tmp_path, spill_at=3)
    (folder,) = tmp_path.glob(".rollcut-index-*")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in folder.iterdir() if f.is_file())
    inputs.close()
    assert not folder.exists()


def test_an_index_a_killed_collector_left_is_swept_by_the_next(tmp_path: Path) -> None:
    Inputs(_tasks(10), 1, near=tmp_path, spill_at=3)  # collected at once: deleted
    assert not list(tmp_path.iterdir())
    live = Inputs(_tasks(10), 1, near=tmp_path, spill_at=3)
    (mine,) = tmp_path.glob(".rollcut-index-*")
    dead_pid = 2**22 + 12345  # above pid_max's default: no process has it
    left = tmp_path / mine.name.replace(f"-{os.getpid()}-", f"-{dead_pid}-")
    left.mkdir()
    other = Inputs(_tasks(10), 1, near=tmp_path, spill_at=3)
    assert not left.exists() and mine.exists()  # the dead one's goes; a live collector's stays
    live.close(), other.close()


def test_the_spill_threshold_is_the_module_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_index, "SPILL_AT", 4)
    assert Inputs(_tasks(5), 1, near=tmp_path).on_disk
    assert not Inputs(_tasks(4), 1, near=tmp_path).on_disk
