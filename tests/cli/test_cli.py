"""The console script, run as a user would: separate processes, JSON on stdout."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import nats
import pytest

from rollcut.bus import BusConfig, EventLog, load_credentials, login_options

from ..helpers import boundary_event

ROLLCUT = [sys.executable, "-m", "rollcut"]


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*ROLLCUT, *args], capture_output=True, text=True, timeout=300)
    if check:  # a failure says why: the command's own words, not only its exit status
        why = f"rollcut {' '.join(args)} exited {done.returncode}: {done.stderr[-4000:]}"
        assert done.returncode == 0, why
    return done


async def test_ledger_rebuild_and_replay_from_the_command_line(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path
) -> None:
    await log.dispatch("r1", {"q": 1}, instance="c")
    await log.append(boundary_event("r1", 0))
    last = await log.last_seq()
    common = ["--url", nats_url, "--namespace", namespace, "--home", str(tmp_path)]
    out = json.loads(_run("ledger", "rebuild", *common, "--json").stdout)
    assert (out["events"], out["watermark"], out["rollouts"], out["previous_kept_at"]) == (
        last,
        last,
        1,
        None,
    )
    # corrupt it: the command refuses to read it; rebuild keeps it aside and recovers
    data = tmp_path / "ledger" / "data.mdb"
    data.write_bytes(os.urandom(8192) + data.read_bytes()[8192:])
    bad = _run("ledger", "status", *common, "--json", check=False)
    assert bad.returncode == 2 and "rollcut ledger rebuild" in bad.stderr
    again = json.loads(_run("ledger", "rebuild", *common, "--json").stdout)
    assert again["previous_kept_at"] and Path(again["previous_kept_at"]).exists()
    status = json.loads(_run("ledger", "status", *common, "--json").stdout)
    assert status["rollouts"][0]["rollout_id"] == "r1" and status["rollouts"][0]["last_boundary_turn"] == 0
    # truncated (a disk that filled, a copy cut short): an error naming the cure, never SIGBUS (exit 135)
    data = tmp_path / "ledger" / "data.mdb"
    whole = data.read_bytes()
    data.write_bytes(whole[: len(whole) // 2])
    cut = _run("ledger", "status", *common, "--json", check=False)
    assert cut.returncode == 2 and "truncated" in cut.stderr and "rollcut ledger rebuild" in cut.stderr
    json.loads(_run("ledger", "rebuild", *common, "--json").stdout)
    state = json.loads(_run("replay", *common, "--json", "--rollout", "r1").stdout)
    assert state["rollouts"]["r1"]["input"] == {"q": 1}
    assert state["rollouts"]["r1"]["attempts"]["1"]["sessions"]["agent"]["boundaries"] == 1


def test_bench_log_prints_the_promised_fields() -> None:
    out = json.loads(_run("bench", "log", "--events", "400", "--concurrency", "32", "--json").stdout)
    for key in (
        "events",
        "append_events_per_s",
        "raw_publish_per_s",
        "append_vs_raw",
        "ceiling_publish_per_s",
        "append_vs_ceiling",
        "replay_events_per_s",
        "raw_read_per_s",
        "replay_vs_raw",
        "streaming_vs_raw",
        "bytes_per_event",
        "ledger_rebuild_s",
    ):
        assert key in out, key
    assert out["events"] == 400 and out["ledger_rebuild_events"] >= 400
    # half the workload's rollouts finish: the streaming fold holds less than the full one
    assert 0 < out["streaming_retained_bytes_per_event"] < out["replay_retained_bytes_per_event"]
    # each ratio is the median of the per-run ratios, each run measured against its own raw baseline
    assert len(out["runs"]) == out["repeat"] == 3
    for key in ("append_vs_raw", "append_vs_ceiling", "replay_vs_raw", "streaming_vs_raw"):
        assert out[key] == statistics.median(r[key] for r in out["runs"]) > 0


async def test_nats_command_serves_until_terminated(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*ROLLCUT, "nats", "--data", str(tmp_path), "--port", "0", "--namespace", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = proc.stdout.readline().strip()  # printed once the server is ready
        assert url.startswith("nats://127.0.0.1:")
        creds = load_credentials(tmp_path / "credentials.json")
        assert creds.namespace == "demo" and (tmp_path / "credentials.json").stat().st_mode & 0o077 == 0
        with pytest.raises(Exception, match="Authorization Violation"):
            await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
        nc = await nats.connect(url, **login_options(BusConfig(url=url).as_role(creds, "admin")))
        info = await nc.jetstream().account_info()
        assert info.limits is not None
        await nc.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert (tmp_path / "jetstream").is_dir()


def test_checkpoint_commands_on_the_embedded_default(tmp_path: Path) -> None:
    home = ["--home", str(tmp_path)]
    rec = json.loads(_run("checkpoint", *home, "--deadline", "10", "--json").stdout)
    assert rec["cut"] > 0 and rec["checkpoint_id"].startswith("ck-")
    listed = json.loads(_run("checkpoints", "list", *home, "--json").stdout)
    assert [r["checkpoint_id"] for r in listed] == [rec["checkpoint_id"]]
    shown = json.loads(_run("checkpoints", "show", rec["checkpoint_id"], *home, "--json").stdout)
    assert shown["cut"] == rec["cut"]
    ok = _run("checkpoints", "verify", rec["checkpoint_id"], *home, "--json")
    assert json.loads(ok.stdout) == {"checkpoint_id": rec["checkpoint_id"], "ok": True, "problems": []}
    missing = _run("checkpoints", "verify", "ck-nope", *home, check=False)
    assert missing.returncode == 1
    at = json.loads(_run("replay", *home, "--checkpoint", rec["checkpoint_id"], "--json").stdout)
    assert at["cut"] == rec["cut"]


def test_bench_checkpoint_prints_the_promised_fields() -> None:
    out = json.loads(
        _run(
            "bench",
            "checkpoint",
            "--rollouts",
            "200",
            "--moved",
            "1",
            "--moved",
            "100",
            "--repeat",
            "2",
            "--json",
        ).stdout
    )
    assert out["rollouts"] == 200 and out["participants"] == 3 and out["repeat"] == 2
    assert out["per_file_files_created"] == 3 * 200 + 3 + 1  # a file per rollout per participant + manifests
    assert out["nemo_files_created"] == 3 + 1  # a records file per participant + the manifest
    assert sorted(out["cases"]) == ["cold", "moved_1", "moved_100"]
    for case in out["cases"].values():
        for key in ("pause_ms", "publish_ms", "checkpoint_ms", "nemo_ms", "vs_nemo_publish", "vs_nemo_pause"):
            assert case[key]["min"] <= case[key]["median"] <= case[key]["max"], key
        # the collection stands still only part of the checkpoint
        assert case["pause_ms"]["max"] < case["checkpoint_ms"]["max"]
    cold, one, every = (
        out["cases"][c]["validated_events"]["median"] for c in ("cold", "moved_1", "moved_100")
    )
    assert one < every < cold  # a steady checkpoint validates only what moved since the last one


def test_bench_model_compares_custody_with_the_same_server_without_it() -> None:
    args = ("bench", "model", "--calls", "30", "--clients", "1", "--clients", "4", "--repeat", "1", "--json")
    out = json.loads(_run(*args).stdout)
    assert sorted(out["clients"]) == ["1", "4"] and out["calls"] == 30
    assert out["calls_generated"] == 2 * 30  # every custody call generated once, none from the log
    for c in out["clients"].values():
        rate = c["custody_calls_per_s"]["median"] / c["plain_calls_per_s"]["median"]
        assert abs(c["throughput_ratio"]["median"] - rate) <= 0.01 * rate + 0.002
        for key in ("plain_p50_ms", "custody_p99_ms", "added_p50_ms", "added_p99_ms"):
            assert c[key]["min"] <= c[key]["median"] <= c[key]["max"], key
        # Linux: what each server process and the load generator spent per call
        assert (
            c["custody_server_cpu_us_per_call"]["median"] > 0
            and c["plain_server_cpu_us_per_call"]["median"] > 0
        )
        assert c["plain_client_cpu_us_per_call"]["median"] > 0


def test_bench_model_with_turns_makes_each_rollouts_calls_one_chain() -> None:
    args = ("bench", "model", "--calls", "12", "--turns", "4", "--clients", "2", "--repeat", "1", "--json")
    out = json.loads(_run(*args).stdout)
    assert out["turns"] == 4 and out["calls_generated"] == 12
    # three rollouts of four calls: each later turn's completion names the call before it
    assert out["calls_with_a_parent"] == 12 - 3
    assert out["clients"]["2"]["throughput_ratio"]["median"] > 0


@pytest.mark.slow
def test_bench_e2e_recovers_each_crash_three_ways_and_spreads_rollcuts_seconds_over_restarts() -> None:
    out = json.loads(_run("bench", "e2e", "--rollouts", "4", "--repeat", "2", "--json").stdout)
    assert out["rollouts"] == 4 and out["paced"] is False
    for way in ("rollcut", "last_checkpoint", "restart"):  # the first crash's figures
        r = out[way]
        for key in ("model_calls_regenerated", "tokens_regenerated", "model_calls_generated", "wall_s"):
            assert key in r, (way, key)
        assert r["results_written"] == 4 and r["duplicate_results"] == 0, (way, r)
    assert out["rollcut"]["model_calls_regenerated"] == 0 and out["rollcut"]["tokens_regenerated"] == 0
    # the same crash each way: every call rollcut kept, restarting from input generated again
    assert out["restart"]["model_calls_regenerated"] == out["rollcut"]["model_calls_kept"] > 0
    assert out["last_checkpoint"]["model_calls_kept"] <= out["rollcut"]["model_calls_kept"]
    # two crashes: each way's seconds to finish after each, rollcut's over restart's spread
    seconds = out["after_crash_s"]
    assert set(seconds) == {"rollcut", "last_checkpoint", "restart"}
    assert all(len(s) == 2 and all(x is not None and x > 0 for x in s) for s in seconds.values())
    assert out["rollcut"]["after_crash_s"] == seconds["rollcut"][0]
    ratios = sorted(r / s for r, s in zip(seconds["rollcut"], seconds["restart"], strict=True))
    spread = out["after_crash_vs_restart"]
    assert (spread["min"], spread["max"]) == (round(ratios[0], 3), round(ratios[1], 3))


@pytest.mark.slow
def test_bench_e2e_without_a_crash_measures_the_collection_against_the_same_stack_without_custody() -> None:
    out = json.loads(_run("bench", "e2e", "--no-crash", "--rollouts", "4", "--repeat", "2", "--json").stdout)
    rollcut, plain = out["rollcut"], out["plain"]
    assert out["repeat"] == 2 and rollcut["results_written"] == plain["results_written"] == [4, 4]
    assert all(n > 0 for n in rollcut["checkpoints_published"])  # custody on: it checkpointed
    for way in (rollcut, plain):
        assert 0 < way["rows_per_s"]["min"] <= way["rows_per_s"]["median"] <= way["rows_per_s"]["max"]
    # each repeat's ratio lies between the extremes the two ways' rates allow (up to the rounding of
    # the printed figures: rates to 2 decimals, ratios to 3)
    vs, slack = out["vs_plain"], 1.01
    assert rollcut["rows_per_s"]["min"] / plain["rows_per_s"]["max"] <= vs["min"] * slack
    assert vs["min"] <= vs["median"] <= vs["max"]
    assert vs["max"] <= rollcut["rows_per_s"]["max"] / plain["rows_per_s"]["min"] * slack


def test_bench_e2e_refuses_what_does_not_go_with_a_crash(capsys: pytest.CaptureFixture[str]) -> None:
    from typer.testing import CliRunner

    from rollcut.cli import app

    for args, said in (
        (["--way", "plain"], "unknown recovery plain"),
        (["--paced", "--engine", "llama.cpp"], "drop --engine"),
        (["--model", "gemma-3-270m"], "add --engine llama.cpp"),
        (["--no-crash", "--way", "restart"], "unknown way without a crash restart"),
        (["--no-crash", "--intervals", "1,2"], "--intervals and --home belong to a crash"),
    ):
        got = CliRunner().invoke(app, ["bench", "e2e", *args])  # refused before anything starts
        assert got.exit_code == 2 and said in capsys.readouterr().err + got.output, (args, got.output)


def test_bench_e2e_on_a_real_model_collects_the_demos_eight_rollouts_unless_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On Gemma the bench runs what ``rollcut demo --model gemma-3-270m`` runs (8 rollouts), not the
    local model's 64 (about 40 minutes on two cores); ``--rollouts`` still decides."""
    from typer.testing import CliRunner

    from rollcut.cli import _bench_e2e, app

    asked: list[int] = []
    monkeypatch.setattr(_bench_e2e, "measure", lambda *_, rollouts, **__: asked.append(rollouts))
    for args in ([], ["--engine", "llama.cpp", "--model", "gemma-3-270m"], ["--engine", "llama.cpp"]):
        assert CliRunner().invoke(app, ["bench", "e2e", *args]).exit_code == 0
    got = CliRunner().invoke(
        app, ["bench", "e2e", "--engine", "llama.cpp", "--model", "gemma-3-270m", "--rollouts", "3"]
    )
    assert got.exit_code == 0
    assert asked == [64, 8, 64, 3]


@pytest.mark.slow
def test_bench_relay_times_live_and_replayed_calls_against_direct_ones() -> None:
    out = json.loads(_run("bench", "relay", "--calls", "20", "--repeat", "2", "--json").stdout)
    # every relay call of the first attempts journaled; every one of the continued attempts replayed
    assert out["calls"] == 20 * 2 * 4 and out["exchanges_live"] == out["exchanges_replayed"] == 40
    assert out["journaled_bytes"] > 0
    for key in ("direct_ms", "relay_live_ms", "relay_replay_ms", "direct_reused_ms"):
        assert 0 < out[key]["p50"] <= out[key]["p99"], key
    for key in ("added_p50_ms", "direct_over_relay_p50"):
        assert out[key]["min"] <= out[key]["median"] <= out[key]["max"], key


def test_bench_nemo_gym_times_a_replayed_restore_against_the_ported_codec_per_call() -> None:
    out = json.loads(_run("bench", "nemo-gym", "--calls", "6", "--repeat", "2", "--json").stdout)
    assert out["calls_per_session"] == 6 and out["repeats"] == 2
    for key in ("replay_ms_per_call", "ported_codec_ms_per_call"):
        assert 0 < out[key]["p50"] <= out[key]["max"], key
    ratio = out["replay_over_codec"]
    assert 0 < ratio["min"] <= ratio["median"] <= ratio["max"]


@pytest.mark.slow
def test_bench_e2e_with_an_opaque_agent_replays_its_journal_and_restart_generates_it_again() -> None:
    out = json.loads(_run("bench", "e2e", "--agent", "opaque", "--rollouts", "6", "--json").stdout)
    assert out["agent"] == "opaque"
    replay, restart = out["rollcut"], out["restart"]
    for r in (replay, restart, out["last_checkpoint"]):
        assert r["results_written"] == 6 and r["duplicate_results"] == 0, r
    # journal replay: every request the lineage completed answered from the journal, nothing again
    assert replay["recovery"]["continue"] > 0 and replay["exchanges_replayed"] > 0
    assert (replay["model_calls_regenerated"], replay["tool_calls_reexecuted"], replay["divergences"]) == (
        0,
        0,
        0,
    )
    # restart from input: the same crash, every call the journal kept generated again
    assert restart["exchanges_replayed"] == 0
    assert restart["model_calls_regenerated"] == replay["model_calls_kept"] > 0
    assert restart["tool_calls_reexecuted"] == replay["tool_calls_kept"] > 0


def test_an_error_is_one_line_with_its_brackets_whatever_the_width(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A refusal names an event id and a server description; wrapped at 80 columns it was split
    mid-phrase (a grep for the server's words missed it), and `[...]` was read as markup."""
    from rollcut.cli._target import fail

    message = "append of ResultAccepted Ke4xo-L9YO5_7NN3 refused: 10077 maximum bytes exceeded [limit 65536]"
    exit_ = fail(message, 74)
    err = capsys.readouterr().err
    assert err == f"error: {message}\n" and exit_.exit_code == 74
