"""``rollcut export`` hands a trainer only what it must get: each rollout once, finite rewards,
rows that parse, and it never writes through a link someone planted at ``--out``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollcut.tokens import LocalTokenStore, TokenRecord


def _row(home: Path, rid: str, *, reward: object = 1.0) -> str:
    with LocalTokenStore(home / "tokens") as store:
        receipt = store.put(f"{rid}-c1", TokenRecord(prompt_ids=[1, 2], output_ids=[3], logprobs=[-0.5]))
    call = {"receipt_id": receipt.receipt_id, "receipt_digest": receipt.digest, "receipt_count": 1}
    body = {"rollout_id": rid, "attempt": 1, "reward": "@R@", "rollcut": {"model_calls": [call]}}
    return json.dumps(body).replace('"@R@"', reward if isinstance(reward, str) else json.dumps(reward))


def _export(home: Path, rows: str, out: Path) -> subprocess.CompletedProcess[str]:
    (home / "rows.jsonl").write_text(rows)
    argv = [sys.executable, "-m", "rollcut", "export", str(home / "rows.jsonl"), "--home", str(home)]
    return subprocess.run([*argv, "--out", str(out)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("reward", "says"),
    [
        ("NaN", "not a JSON row"),  # Python's json writes these; JSON has no such numbers
        ("-Infinity", "not a JSON row"),
        ("1e999", "not a JSON row"),
        ('"1.0"', "is not a finite number"),
        ("true", "is not a finite number"),
    ],
)
def test_a_reward_that_is_not_a_finite_number_is_refused(tmp_path: Path, reward: str, says: str) -> None:
    out = tmp_path / "train.jsonl"
    done = _export(tmp_path, _row(tmp_path, "r", reward=reward) + "\n", out)
    assert done.returncode == 1, done.stderr
    assert "rows.jsonl:1" in done.stderr and says in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()


def test_a_rollout_whose_row_appears_twice_is_refused_not_exported_twice(tmp_path: Path) -> None:
    out = tmp_path / "train.jsonl"
    row = _row(tmp_path, "r")
    done = _export(tmp_path, f"{row}\n{row}\n", out)
    assert done.returncode == 1 and "also at line 1" in done.stderr, done.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "garbage",
    [
        "not json",
        "[1, 2]",
        '{"rollout_id": "r", "rollcut": {"model_calls": [{"receipt_id": 5}]}}',
        '{"rollout_id": "r", "rollcut": {"model_calls": "x"}, "response": {"output": 3}}',
        "[" * 50_000 + "]" * 50_000,
    ],
)
def test_a_malformed_row_is_refused_naming_its_line_without_a_traceback(tmp_path: Path, garbage: str) -> None:
    out = tmp_path / "train.jsonl"
    done = _export(tmp_path, _row(tmp_path, "ok") + "\n" + garbage + "\n", out)
    assert done.returncode == 1, done.stderr
    assert "rows.jsonl:2" in done.stderr and "Traceback" not in done.stderr


def test_a_symlink_at_out_is_replaced_and_its_target_left_alone(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "train.jsonl"
    out.symlink_to(victim)
    done = _export(tmp_path, _row(tmp_path, "r") + "\n", out)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious"
    assert not out.is_symlink() and json.loads(out.read_text().splitlines()[0])["rollout_id"] == "r"
    assert os.stat(out).st_mode & 0o777 == 0o600
