"""Finding 11 of issue 29: every failure exits by the table with one line naming it, never a
traceback (that is exit 70, a bug): a truncated ledger, a corrupt token store, an unwritable output,
a full disk at start, garbage in the collection's own output."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from rollcut.demo import demo_tasks

from ..e2e.conftest import deploy, finish

ROLLCUT = [sys.executable, "-m", "rollcut"]


def _rollcut(home: Path, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ROLLCUT, *args, "--home", str(home)], capture_output=True, text=True, timeout=120, **kw
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A home with one published checkpoint (the embedded server, no participant)."""
    home = tmp_path_factory.mktemp("exit") / "home"
    done = _rollcut(home, "checkpoint", "--json")
    assert done.returncode == 0, done.stderr
    return home, json.loads(done.stdout)["checkpoint_id"]


def _copy(src: Path, dst: Path) -> Path:
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    return dst


@pytest.mark.parametrize(
    "command",
    [
        ["checkpoints", "list"],
        ["checkpoints", "show", "CK"],
        ["replay", "--checkpoint", "CK"],
        ["ledger", "status"],
        ["checkpoints", "verify", "CK"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_a_truncated_ledger_is_exit_2_for_every_command_that_reads_it(
    home: tuple[Path, str], tmp_path: Path, command: list[str]
) -> None:
    """Before: ``checkpoints list`` and ``replay --checkpoint`` exit 1 with a traceback where
    ``ledger status`` exits 2."""
    copy = _copy(home[0], tmp_path / "home")
    data = copy / "ledger" / "data.mdb"
    before = data.stat().st_size
    with data.open("r+b") as f:
        f.truncate(4096)
    done = _rollcut(copy, *[home[1] if a == "CK" else a for a in command])
    assert done.returncode == 2, done.stderr
    assert "truncated" in done.stderr and "ledger rebuild" in done.stderr
    assert "Traceback" not in done.stderr
    assert data.stat().st_size == 4096 < before  # left as it was found


@pytest.mark.parametrize("command", [["checkpoint"], ["checkpoints", "verify", "CK"]], ids=" ".join)
def test_a_corrupt_token_store_is_exit_2_naming_it(
    home: tuple[Path, str], tmp_path: Path, command: list[str]
) -> None:
    copy = _copy(home[0], tmp_path / "home")
    data = copy / "tokens" / "data.mdb"
    with data.open("r+b") as f:
        f.truncate(4096)
    done = _rollcut(copy, *[home[1] if a == "CK" else a for a in command])
    assert done.returncode == 2, done.stderr
    assert str(data) in done.stderr and "Traceback" not in done.stderr


def test_collect_exits_by_the_table_for_an_unwritable_output_a_full_disk_and_garbage_rows(
    tmp_path: Path,
) -> None:
    with deploy(tmp_path, demo_tasks(3, seed=7)) as dep:
        # an output nobody can write (its directory is a file): one line, the storage exit
        (tmp_path / "afile").write_text("")
        bad = dep.config.with_name("bad.yaml")
        bad.write_text(dep.config.read_text().replace("output: results.jsonl", "output: afile/rows.jsonl"))
        done = subprocess.run(
            [*ROLLCUT, "collect", str(bad), "--json"], capture_output=True, text=True, timeout=120
        )
        assert done.returncode in (2, 74), done.stderr
        assert "afile" in done.stderr and "Traceback" not in done.stderr

        # a full disk from the very start (no file may grow): 74, the disk's own reason
        def no_room() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

        full = subprocess.run(
            [*ROLLCUT, "collect", str(dep.config), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=no_room,
        )
        assert full.returncode == 74, full.stderr
        assert "File too large" in full.stderr and "Traceback" not in full.stderr

        code, out = finish(dep.collect())
        assert code == 0 and out["results_written"] == 3, out
        rows = dep.output.read_bytes()
        for garbage in (b"\xff\xfe not text\n", b"[" * 100_000 + b"\n"):
            dep.output.write_bytes(rows + garbage + rows.splitlines(keepends=True)[0])
            done = subprocess.run(
                [*ROLLCUT, "collect", str(dep.config), "--json", "--resume"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 2, done.stderr
            assert f"{dep.output} line 4" in done.stderr and "Traceback" not in done.stderr
