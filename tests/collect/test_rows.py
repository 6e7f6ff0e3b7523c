"""A collection's input rows are checked, not rewritten; its output belongs to it; a torn row is cut."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollcut import ConfigError
from rollcut.collect import Rows, load_rows


def _rows(tmp_path: Path, *rows: object) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("bad", ["a.b", "a b", "*", ">", "../../etc", "x" * 101])
def test_a_task_id_outside_the_alphabet_is_refused_naming_its_line(tmp_path: Path, bad: str) -> None:
    numbered = load_rows(_rows(tmp_path, {"id": "ok"}, "", {"id": bad}))
    with pytest.raises(ConfigError, match="on line 3"):
        Rows([r for _, r in numbered], 1, tmp_path / "out.jsonl", lines=[n for n, _ in numbered])


def test_duplicate_task_ids_are_refused_naming_both_lines(tmp_path: Path) -> None:
    numbered = load_rows(_rows(tmp_path, {"id": "a"}, {"id": "b"}, {"id": "a", "prompt": "other"}))
    with pytest.raises(ConfigError, match="on lines 1 and 3"):
        Rows([r for _, r in numbered], 2, tmp_path / "out.jsonl", lines=[n for n, _ in numbered])


def test_a_line_that_is_not_a_json_object_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="line 2 is not a JSON object"):
        load_rows(_rows(tmp_path, {"id": "a"}, "{not json"))
    with pytest.raises(ConfigError, match="line 1 is not a JSON object"):
        load_rows(_rows(tmp_path, [1, 2]))


def test_a_torn_last_row_is_cut_and_whole_rows_stay(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    rows = Rows([{"id": "a"}, {"id": "b"}], 1, out)
    rows.claim("ns")
    out.write_bytes(json.dumps({"rollout_id": "a-0"}).encode() + b'\n{"rollout_id": "b-0", "rew')
    assert [r["rollout_id"] for r in rows.written()] == ["a-0"]
    assert rows.torn_bytes > 0 and out.read_bytes().endswith(b"\n")  # the torn row is gone from the file


def test_a_row_of_another_collection_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    rows = Rows([{"id": "a"}], 1, out)
    rows.claim("ns")
    out.write_text(json.dumps({"rollout_id": "someone-else-0"}) + "\n")
    with pytest.raises(ConfigError, match="not a row of this collection"):
        list(rows.written())


def test_an_output_belongs_to_its_collection(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    Rows([{"id": "a"}], 1, out).claim("first")
    Rows([{"id": "a"}], 1, out).claim("first")  # the same collection again: fine
    with pytest.raises(ConfigError, match="belongs to the collection of namespace 'first'"):
        Rows([{"id": "a"}], 1, out).claim("second")
    stray = tmp_path / "stray.jsonl"
    stray.write_text(json.dumps({"rollout_id": "a-0"}) + "\n")  # rows, and no claim beside them
    with pytest.raises(ConfigError, match="unknown collection"):
        Rows([{"id": "a"}], 1, stray).claim("first")
