"""A TRL loop's home read as untrusted (issue 49): its records are read only if they are regular
files of a record's size, and what is not the loop's own is left alone."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from rollcut.integrations.trl import GlobalCheckpoint, RestorePoint, publish_global
from rollcut.integrations.trl._global import global_records, set_aside

RECORD = GlobalCheckpoint(
    step=1,
    trainer_checkpoint="trainer/checkpoint-1",
    trainer_digest="aa",
    rollcut_checkpoint_id="ck-1",
    token_snapshot_id="snap-ck-1",
    token_snapshot_digest="bb",
    policy_version=1,
    policy_gguf_sha256="cc",
    consumed=["r0"],
)


@pytest.mark.timeout(60)
def test_a_record_that_is_a_fifo_or_a_link_to_a_device_is_passed_over_not_read(tmp_path: Path) -> None:
    good = publish_global(tmp_path, RECORD)
    os.mkfifo(good.with_name("step-000003.json"))  # before: restore hung opening it
    os.symlink("/dev/zero", good.with_name("step-000002.json"))  # before: MemoryError, its size read after
    found = list(global_records(tmp_path))
    assert [p.name for p, _ in found] == ["step-000003.json", "step-000002.json", "step-000001.json"]
    assert all(isinstance(r, str) and r.startswith("unreadable") for _, r in found[:2]), found
    assert found[2][1] == RECORD


def test_a_record_over_the_size_of_one_is_passed_over(tmp_path: Path) -> None:
    publish_global(tmp_path, RECORD)
    (tmp_path / "global" / "step-000002.json").write_bytes(b" " * (2 << 20) + msgspec.json.encode(RECORD))
    found = dict((p.name, r) for p, r in global_records(tmp_path))
    assert isinstance(found["step-000002.json"], str) and "more than" in found["step-000002.json"]


def test_set_aside_moves_only_the_loops_own_rows(tmp_path: Path) -> None:
    rows = tmp_path / "rows"
    rows.mkdir()
    for name in ("step-000001.jsonl", "step-000002.jsonl", "step-000001.old.jsonl", "step-x.jsonl"):
        (rows / name).write_text("{}\n")
    point = RestorePoint(record=RECORD, passed_over=["step-000002.json: its half is gone"], epoch=1)
    set_aside(tmp_path, point)  # before: ValueError on step-000001.old.jsonl
    assert sorted(p.name for p in rows.iterdir()) == ["step-000001.old.jsonl", "step-x.jsonl"]
    assert sorted(p.name for p in (tmp_path / "passed-over-e1").iterdir()) == [
        "step-000001.jsonl",
        "step-000002.jsonl",
    ]
