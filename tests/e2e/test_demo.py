"""`rollcut demo` as a newcomer runs it: the story as it happens, what the crash cost three ways, the
work left behind, and `rollcut report`'s page of it in a real headless browser."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ..browser import page

pytestmark = pytest.mark.slow

ROLLCUT = [sys.executable, "-m", "rollcut"]
ROLLOUTS = 10
WIDE = {"COLUMNS": "220"}  # a table row on one line, as in a wide terminal


def _rollcut(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*ROLLCUT, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **WIDE}
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _row(table: str, name: str) -> list[str]:
    """A summary table's row, by its name: the cells after it."""
    line = next(ln for ln in table.splitlines() if f"│ {name} " in ln)
    return [c.strip() for c in line.split("│")[2:-1]]


def _check_rows(home: Path) -> None:
    rows = [json.loads(line) for line in (home / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == ROLLOUTS and len({r["rollout_id"] for r in rows}) == ROLLOUTS
    for r in rows:  # NeMo Gym's row format, one per rollout
        assert {
            "responses_create_params",
            "response",
            "reward",
            "_ng_task_index",
            "_ng_rollout_index",
        } <= r.keys()
        assert r["_ng_attempt_index"] == r["attempt"] - 1 and r["response"]["output"]


def _check_story(said: str, out: dict[str, Any]) -> None:
    crash = out["crash"]
    order = [
        "started the Gym processes",
        "checkpoint 1 published",
        "CRASH: SIGKILL to every Gym process",
        "restarted the Gym processes",
        "resume from checkpoint",
    ]
    where = [said.index(s) for s in order]
    assert where == sorted(where), said[:3000]
    for name, pid in crash["killed"].items():  # each process killed, named with its pid
        assert f"{name} (pid {pid})" in said
    assert set(crash["killed"]) == {"model", "counter", "blackjack", "workplace", "agent", "environment"}
    # the crash landed mid-episode: something finished, most still running
    st = crash["standing"]
    assert st["finished"] >= 1 and st["mid_episode"] >= 1 and sum(st.values()) == ROLLOUTS
    rec = out["recovery"]
    continued = rec["continue"]
    assert rec["completed"] == st["finished"] and continued >= 1
    assert continued + rec["fresh_dispatch"] == st["mid_episode"] + st["not_yet"]
    assert len(re.findall(r"↪ \S+ continues as attempt 2 after turn \d+", said)) == min(continued, 8)
    # the progress line's last word agrees with the final numbers
    last = re.findall(r"collecting \((\d+) running, (\d+) checkpoints published\)\W+(\d+)/(\d+)", said)[-1]
    assert last == ("0", str(out["checkpoints_published"]), str(ROLLOUTS), str(ROLLOUTS))


def _check_saving(table: str, out: dict[str, Any]) -> None:
    cmp = out["compared"]
    ours, last, restart = cmp["rollcut"], cmp["last_checkpoint"], cmp["restart"]
    # rollcut: nothing completed done again; what it kept, restarting from input generated again
    assert (ours["model_calls_regenerated"], ours["tokens_regenerated"], ours["tool_calls_reexecuted"]) == (
        0,
        0,
        0,
    )
    assert ours["model_calls_kept"] >= 1
    assert restart["model_calls_regenerated"] == ours["model_calls_kept"]
    assert restart["tokens_regenerated"] == ours["tokens_kept"]
    assert restart["tool_calls_reexecuted"] == ours["tool_calls_kept"]
    assert last["model_calls_kept"] <= ours["model_calls_kept"]
    # the model's own count of what it generated: what a crash loses in flight, and what each way's
    # seconds were spent on (the local model decodes at a real model's pace)
    assert all(w["engine"]["dialect"] == "local" for w in cmp.values())
    kept_by_cuts = ours["engine"]["tokens_kept_by_cuts"]
    assert kept_by_cuts > 0  # the crash found generations in flight, and their cuts kept them
    assert ours["tokens_lost_in_flight"] == restart["tokens_lost_in_flight"] - kept_by_cuts
    assert restart["tokens_generated_after_crash"] == (
        ours["tokens_generated_after_crash"] + ours["tokens_kept"] + kept_by_cuts
    )
    for way in cmp.values():  # every copy finished too, each rollout once
        assert way["results_written"] == ROLLOUTS
        copy = Path(way["home"])
        ids = [json.loads(line)["rollout_id"] for line in (copy / "rollouts.jsonl").read_text().splitlines()]
        assert len(ids) == len(set(ids)) == ROLLOUTS
    # the table the user reads says the same, under real headers, with a legend
    assert re.search(r"┃\s+┃ rollcut\s+┃ last checkpoint only\s+┃ restart from input\s+┃", table)
    for key, name in [
        ("model_calls_regenerated", "model calls generated again"),
        ("tokens_kept", "tokens kept"),
        ("tokens_lost_in_flight", "tokens lost in flight"),
        ("tokens_generated_after_crash", "tokens generated after"),
    ]:
        assert _row(table, name) == [f"{cmp[w][key]:,}" for w in ("rollcut", "last_checkpoint", "restart")]
        assert f"  {name}: " in table  # its legend line
    assert _row(table, "rows written") == [f"{ROLLOUTS} of {ROLLOUTS}"]


def test_the_demo_tells_the_crash_shows_what_it_saved_and_leaves_a_home_to_report_on(tmp_path: Path) -> None:
    home = tmp_path / "demo"
    done = _rollcut("demo", "--rollouts", str(ROLLOUTS), "--home", str(home), timeout=400)
    out = json.loads((home / "demo.json").read_text())
    assert out["crashes"] == 1 and out["results_written"] == ROLLOUTS and out["duplicate_results"] == 0
    assert out["model_calls"]["regenerated_after_crash"] == 0 and out["failed"] == {}
    assert out["model"] == {
        "backend": "local",
        "engine": None,
        "name": "rollcut-local",
        "pace": out["model"]["pace"],
    } and out["model"]["pace"].startswith("Gemma 3 270M")
    assert "The local model decodes at the pace of Gemma 3 270M" in done.stdout
    _check_rows(home)
    _check_story(done.stderr, out)
    _check_saving(done.stdout, out)
    assert f"rollcut report --home {home}" in done.stdout  # the commands to try next
    assert (home / "demo.json").stat().st_mode & 0o777 == 0o600
    assert all(p.stat().st_mode & 0o777 == 0o700 for p in [home, home / "logs", home / "compare"])

    # the commands it suggests work on the home it left, in its namespace, without being told it
    rid = _continued(home)
    replayed = json.loads(_rollcut("replay", "--home", str(home), "--rollout", rid, "--json").stdout)
    assert list(replayed["rollouts"]) == [rid]
    assert replayed["rollouts"][rid]["current_attempt"] == 2 and replayed["rollouts"][rid]["accepted_seq"]
    listed = json.loads(_rollcut("checkpoints", "list", "--home", str(home), "--json").stdout)
    assert len(listed) == out["checkpoints_published"]
    shown = json.loads(_rollcut("report", "--home", str(home), "--json").stdout)
    rec = out["recovery"]
    # one attempt per rollout, and one more for each the crash interrupted
    attempts = ROLLOUTS + rec["continue"] + rec["fresh_dispatch"] - out["fresh_dispatch_never_started"]
    assert shown["attempts"] == attempts and shown["crashes"] == 1
    assert shown["classes"]["continued"] == rec["continue"]

    with page(Path(shown["report"])) as (pg, seen):
        bars = pg.locator("rect.attempt")
        assert bars.count() == attempts
        titles = pg.locator("rect.attempt > title").all_text_contents()
        named = {re.match(r"rollout (\S+), attempt (\d+):", t).groups() for t in titles}  # type: ignore[union-attr]
        assert len(named) == attempts
        assert pg.locator("rect.crash").count() == 1 and pg.locator("path.link").count() == rec["continue"]
        assert pg.locator("h1").inner_text() == "rollcut report"
        box = pg.locator("svg.timeline").bounding_box()
        assert (
            box is not None and box["width"] > 500 and box["height"] > ROLLOUTS * 10
        )  # drawn, not just present
        assert seen == []  # no console message, no page error, no request (nothing is fetched)


def _continued(home: Path) -> str:
    rows = [json.loads(line) for line in (home / "rollouts.jsonl").read_text().splitlines()]
    return next(r["rollout_id"] for r in rows if r["attempt"] == 2)


@pytest.mark.timeout(900)  # four recoveries of one crash, one after the other
def test_the_same_crash_at_several_checkpoint_intervals_is_one_curve_per_way_on_the_page(
    tmp_path: Path,
) -> None:
    """``bench e2e --intervals``: copies of one crash recovered the last-checkpoint way at each interval;
    rollcut loses nothing at any interval, the last checkpoint loses at most what restarting loses,
    and the page of the kept home draws one curve per way."""
    home = tmp_path / "bench"
    ways = ["--way", "rollcut", "--way", "last_checkpoint", "--way", "restart"]
    done = _rollcut(
        "bench",
        "e2e",
        "--rollouts",
        "6",  # fewer than the demo's: the curve is about intervals, and each is a whole recovery
        "--intervals",
        "0.5,8",
        *ways,
        "--home",
        str(home),
        "--json",
        timeout=600,
    )
    curve = json.loads(done.stdout)["curve"]
    assert curve["intervals_s"] == [0.5, 8.0]
    assert curve["rollcut"]["model_calls_regenerated"] == 0
    lost = [p["model_calls_regenerated"] for p in curve["last_checkpoint"]]
    assert all(0 <= n <= curve["restart"]["model_calls_regenerated"] for n in lost)
    # the 8 s checkpoint is never newer than the 0.5 s one (or there was none by the crash)
    ages = [p["checkpoint_age_s"] for p in curve["last_checkpoint"]]
    assert ages[1] is None or (ages[0] is not None and ages[1] >= ages[0])
    shown = json.loads(_rollcut("report", "--home", str(home), "--json").stdout)
    with page(Path(shown["report"])) as (pg, seen):
        lines = pg.locator("svg.curve-chart polyline.curve")
        assert sorted(lines.evaluate_all("ls => ls.map(l => l.dataset.way)")) == [
            "last_checkpoint",
            "restart",
            "rollcut",
        ]
        box = pg.locator("svg.curve-chart").bounding_box()
        assert box is not None and box["width"] > 300
        assert seen == []


def test_the_demo_on_nemo_gyms_own_servers_keeps_every_row_once_and_names_levels(tmp_path: Path) -> None:
    """``rollcut demo --nemo-gym``: NeMo Gym's stateful counter and multi-step servers, unmodified, on
    their own example rows, SIGKILLed mid-run with every Gym process; the resume keeps every row once,
    generates no completed model call again, and says per server the level it ran at, what the crash
    cost it and what it kept."""
    home = tmp_path / "nemo"
    done = _rollcut(
        "demo",
        "--nemo-gym",
        "--unpaced",
        "--rollouts",
        str(ROLLOUTS),
        "--no-compare",
        "--home",
        str(home),
        timeout=400,
    )
    out = json.loads((home / "demo.json").read_text())
    assert out["crashes"] == 1 and out["results_written"] == ROLLOUTS and out["duplicate_results"] == 0
    assert out["model_calls"]["regenerated_after_crash"] == 0 and out["failed"] == {}
    assert {s: v["level"] for s, v in out["nemo_gym"].items()} == {
        "example_session_state_mgmt": "replayable",
        "example_multi_step": "stateless",
    }
    _check_rows(home)
    rows = [json.loads(line) for line in (home / "rollouts.jsonl").read_text().splitlines()]
    synonyms = [r for r in rows if "synonym" in json.dumps(r["responses_create_params"]["input"])]
    assert len(synonyms) == ROLLOUTS // 2  # the servers' own example rows, taken in turn
    assert _row(done.stdout, "level") == ["replayable", "stateless"]  # a column per server
    servers = out["nemo_gym"].values()
    assert sum(s["rollouts"] for s in servers) == ROLLOUTS and all(
        s["rows"] == s["rollouts"] for s in servers
    )
    assert all(s["model_calls_regenerated"] == 0 and s["tool_calls_reexecuted"] == 0 for s in servers)
    assert (
        sum(s["continued"] + s["started_over"] for s in servers) > 0
    )  # the crash found rollouts mid-episode
    stateless = out["nemo_gym"]["example_multi_step"]
    assert stateless["calls_replayed"] == 0  # seeded afresh: nothing to give again
