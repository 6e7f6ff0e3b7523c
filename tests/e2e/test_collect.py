"""`rollcut collect` end to end: real processes, SIGKILL, SIGTERM, SIGUSR1."""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rollcut.bus import (
    AttemptOpened,
    BusConfig,
    EventLog,
    ModelCallAdmitted,
    ModelCallCompleted,
    ModelCallContinued,
    ModelCallReused,
    load_credentials,
)
from rollcut.gym.wire import ErrorKind

from .conftest import NS, SIGTERM, SIGUSR1, Deployment, finish

pytestmark = pytest.mark.slow


def test_sigterm_checkpoints_exits_75_and_resume_finishes(deployment: Deployment) -> None:
    proc = deployment.collect()
    deployment.wait_rows(4, proc)
    proc.send_signal(SIGTERM)
    code, summary = finish(proc)
    assert code == 75 and summary["interrupted"] is True and summary["checkpoints_published"] == 1
    code, summary = finish(deployment.collect("--resume"))
    assert code == 0, summary
    deployment.each_rollout_once()
    assert summary["recovery"]["completed"] >= 4


def test_sigusr1_checkpoints_and_collection_goes_on(deployment: Deployment) -> None:
    proc = deployment.collect()
    deployment.wait_rows(2, proc)
    proc.send_signal(SIGUSR1)
    code, summary = finish(proc)
    assert code == 0 and summary["checkpoints_published"] == 1 and not summary["interrupted"]
    deployment.each_rollout_once()


def test_crash_of_every_gym_process_then_resume_finishes_exactly_once(deployment: Deployment) -> None:
    proc = deployment.collect()
    deployment.wait_rows(4, proc)
    deployment.crash()  # SIGKILL every Gym process mid-run
    proc.send_signal(SIGTERM)  # the collector notices and stops, as a scheduler would stop it
    finish(proc)
    deployment.restart()
    code, summary = finish(deployment.collect("--resume"))
    assert code == 0, summary
    deployment.each_rollout_once()
    assert summary["recovery"]["continue"] + summary["recovery"]["fresh_dispatch"] >= 1
    # what the crash cost, as the restarted model server counts it, is what the log shows: calls an
    # earlier attempt admitted and never finished, generated from scratch by a continued attempt
    model = next(p for p in deployment.stack if p.name == "model")
    metrics = {
        s.name: s.value
        for family in text_string_to_metric_families(httpx.get(f"{model.url}/metrics", timeout=10).text)
        for s in family.samples
    }
    calls, tokens = asyncio.run(_regenerated(deployment))
    assert metrics["rollcut_model_calls_regenerated_total"] == calls
    assert metrics["rollcut_model_tokens_regenerated_total"] == tokens


async def _regenerated(dep: Deployment) -> tuple[int, int]:
    """From the log: continued attempts' calls generated from scratch (not reused, not continued from
    a cut) for a request an earlier attempt of the rollout admitted and never completed; and their
    output tokens (each completed call's token record names its count)."""
    log = await EventLog.connect(
        BusConfig(url=dep.url, namespace=NS).as_role(load_credentials(dep.creds), "admin")
    )
    try:
        events = [s.event async for s in log.read()]
    finally:
        await log.close()
    admitted: dict[tuple[str, int], set[str]] = {}
    finished: dict[tuple[str, int], set[str]] = {}
    continued_ids = {e.call_id for e in events if isinstance(e, ModelCallContinued)}
    continued_attempts = {
        (e.rollout_id, e.attempt) for e in events if isinstance(e, AttemptOpened) and e.from_cut
    }
    for e in events:
        if isinstance(e, ModelCallAdmitted):
            admitted.setdefault((e.rollout_id, e.attempt), set()).add(e.request_digest)
        elif isinstance(e, ModelCallCompleted | ModelCallReused):
            finished.setdefault((e.rollout_id, e.attempt), set()).add(e.request_digest)
    calls = tokens = 0
    for e in events:
        if not isinstance(e, ModelCallCompleted) or e.call_id in continued_ids:
            continue
        if (e.rollout_id, e.attempt) not in continued_attempts:
            continue
        lost_before = any(
            e.request_digest
            in admitted.get((e.rollout_id, n), set()) - finished.get((e.rollout_id, n), set())
            for n in range(1, e.attempt)
        )
        if lost_before:
            calls, tokens = calls + 1, tokens + e.receipt.count
    return calls, tokens


def test_a_running_collection_heals_when_every_gym_process_dies_and_comes_back(
    deployment: Deployment,
) -> None:
    proc = deployment.collect()
    deployment.wait_rows(3, proc)
    deployment.crash()  # SIGKILL every Gym process mid-run; the collection keeps running
    deployment.restart(same_ports=True)  # a supervisor starts them again where they were
    code, summary = finish(proc)
    assert code == 0, summary
    deployment.each_rollout_once()
    assert summary["healed"] >= 1 and summary["checkpoints_published"] >= 1
    # every run that broke off is counted by what it met, though its rollout then succeeded
    assert sum(summary["faults"].values()) >= 1 and set(summary["faults"]) <= {
        "environment_unreachable",
        *(k.value for k in ErrorKind),
    }, summary["faults"]


def test_a_corrupted_ledger_is_rebuilt_from_the_stream_and_collection_resumes(deployment: Deployment) -> None:
    proc = deployment.collect()
    deployment.wait_rows(4, proc)
    proc.send_signal(SIGTERM)
    assert finish(proc)[0] == 75
    data = deployment.root / "ledger" / "data.mdb"
    data.write_bytes(b"\\x00" * 8192 + data.read_bytes()[8192:])
    code, summary = finish(deployment.collect("--resume"))
    assert code == 2  # refused, untouched
    creds = deployment.root / "nats" / "credentials.json"
    rebuilt = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollcut",
            "ledger",
            "rebuild",
            "--url",
            deployment.url,
            "--namespace",
            "demo",
            "--credentials",
            str(creds),
            "--ledger",
            str(deployment.root / "ledger"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr[-1000:]
    assert json.loads(rebuilt.stdout)["checkpoints"] >= 1
    code, summary = finish(deployment.collect("--resume"))
    assert code == 0, summary
    deployment.each_rollout_once()


def test_a_corrupted_event_makes_only_its_rollout_a_fresh_dispatch(deployment: Deployment) -> None:
    import asyncio

    from rollcut.bus import (
        AgentBoundary,
        AttemptOpened,
        BusConfig,
        EventLog,
        ResultAccepted,
        load_credentials,
    )

    proc = deployment.collect()
    deployment.wait_rows(4, proc)
    proc.send_signal(SIGTERM)
    assert finish(proc)[0] == 75
    creds = load_credentials(deployment.root / "nats" / "credentials.json")

    async def corrupt_one() -> tuple[str, set[str]]:
        log = await EventLog.connect(BusConfig(url=deployment.url).as_role(creds, "admin"))
        try:
            accepted = {s.event.rollout_id async for s in log.read() if isinstance(s.event, ResultAccepted)}
            progressed = sorted(
                {s.event.rollout_id async for s in log.read() if isinstance(s.event, AgentBoundary)}
                - accepted
            )
            victim = progressed[0]
            frame = bytearray(
                log.codec.encode(
                    AgentBoundary(
                        component="agent",
                        instance="agent-w0",
                        rollout_id=victim,
                        attempt=1,
                        record={"turn": 9},
                    )
                )
            )  # type: ignore[arg-type]
            frame[-1] ^= 0xFF  # bit rot in a stored payload
            await log.nc.jetstream().publish(log.subjects.event(victim, 1, "agent"), bytes(frame))
            return victim, set(progressed[1:])
        finally:
            await log.close()

    victim, others = asyncio.run(corrupt_one())
    assert others, "need at least one other rollout with progress"
    code, summary = finish(deployment.collect("--resume"))
    assert code == 0, summary
    deployment.each_rollout_once()

    async def opened() -> dict[str, int]:
        log = await EventLog.connect(BusConfig(url=deployment.url).as_role(creds, "admin"))
        try:
            return {
                s.event.rollout_id: s.event.from_cut
                async for s in log.read(strict=False)
                if isinstance(s.event, AttemptOpened) and s.event.attempt == 2
            }
        finally:
            await log.close()

    attempt2 = asyncio.run(opened())
    assert attempt2[victim] == 0  # its history is corrupt: it starts again from its input
    assert all(attempt2[r] > 0 for r in others)  # everyone else continued from the cut


def test_restore_and_resume_by_hand_then_collection_finishes(deployment: Deployment) -> None:
    proc = deployment.collect()
    deployment.wait_rows(4, proc)
    proc.send_signal(SIGTERM)
    code, summary = finish(proc)
    assert code == 75
    ck = summary["last_checkpoint"]
    creds = str(deployment.root / "nats" / "credentials.json")
    common = [
        "--url",
        deployment.url,
        "--namespace",
        "demo",
        "--credentials",
        creds,
        "--home",
        str(deployment.root),
        "--json",
    ]
    restored = subprocess.run(
        [sys.executable, "-m", "rollcut", "restore", "--checkpoint", ck, *common],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert restored.returncode == 0, restored.stderr[-1500:]
    plan = json.loads(restored.stdout)
    assert len(plan["completed"]) >= 4 and plan["participants_paused"]
    resumed = subprocess.run(
        [sys.executable, "-m", "rollcut", "resume", "--checkpoint", ck, *common],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0 and sorted(json.loads(resumed.stdout)["resumed"]) == sorted(
        plan["participants_paused"]
    )
    code, summary = finish(deployment.collect())  # attempts are open: a plain run finishes them
    assert code == 0, summary
    deployment.each_rollout_once()


def test_an_output_that_is_not_a_file_is_refused_clearly_and_nothing_is_acknowledged(
    deployment: Deployment,
) -> None:
    (deployment.root / "a-directory").mkdir()
    config = deployment.config.read_text().replace("output: results.jsonl", "output: a-directory")
    deployment.config.write_text(config)
    code, summary = finish(deployment.collect())
    assert code == 2, summary
    assert "is not a regular file" in summary["stderr"] and "Traceback" not in summary["stderr"]
    status = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollcut",
            "ledger",
            "status",
            "--json",
            "--url",
            deployment.url,
            "--namespace",
            "demo",
            "--credentials",
            str(deployment.creds),
            "--ledger",
            str(deployment.root / "ledger-check"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert not [r for r in json.loads(status.stdout)["rollouts"] if r["accepted_seq"]]


def test_rollouts_left_without_a_row_exit_1_and_are_listed(deployment: Deployment) -> None:
    config = deployment.config.read_text()
    config = config.replace(
        f"environment_url: {deployment.stack[-1].url}", "environment_url: http://127.0.0.1:9"
    )
    deployment.config.write_text(config + "heal_timeout_s: 1\n")
    code, summary = finish(deployment.collect())
    assert code == 1, summary
    assert len(summary["pending"]) == deployment.rollouts and summary["results_written"] == 0
    assert all("environment unreachable" in summary["failed"][r] for r in summary["pending"])


def test_two_collectors_on_one_namespace_one_runs_the_other_exits_2_naming_it(deployment: Deployment) -> None:
    first, second = deployment.collect(), deployment.collect()
    (code1, out1), (code2, out2) = finish(first), finish(second)
    codes = sorted([code1, code2])
    assert codes == [0, 2], (out1, out2)
    refused = out1 if code1 == 2 else out2
    assert "is held by collector" in refused["stderr"] and "pid" in refused["stderr"]
    deployment.each_rollout_once()
    # the winner released the lease when it finished: the namespace is free again at once
    code, out = finish(deployment.collect())
    assert code == 0 and out["results_written"] == deployment.rollouts


async def _limit_stream(dep: Deployment, room: int | None) -> None:
    """As an operator (or a full disk) would: the stream takes ``room`` more bytes, or no limit."""
    admin = BusConfig(url=dep.url).as_role(load_credentials(dep.creds), "admin")
    log = await EventLog.connect(admin)
    try:
        js = log.nc.jetstream()
        info = await js.stream_info(log.stream)
        cfg = info.config
        cfg.max_bytes = -1 if room is None else info.state.bytes + room
        await js.update_stream(cfg)
    finally:
        await log.close()


def test_a_full_bus_mid_collection_stops_naming_why_and_resume_finishes_once(
    deployment: Deployment,
) -> None:
    proc = deployment.collect()
    deployment.wait_rows(3, proc)
    asyncio.run(_limit_stream(deployment, 4096))  # the stream's storage runs out mid-collection
    code, out = finish(proc, timeout=120)
    assert code == 74, out  # the storage/bus exit, by itself: not a hang, not exit 0
    assert "maximum bytes exceeded" in out["stderr"], out
    assert len(deployment.rows()) < deployment.rollouts
    asyncio.run(_limit_stream(deployment, None))  # room made
    code, out = finish(deployment.collect("--resume"))
    assert code == 0, out
    deployment.each_rollout_once()


def test_sigterm_on_a_full_bus_exits_74_naming_it_without_a_traceback_and_resume_finishes_once(
    deployment: Deployment,
) -> None:
    """Finding 11 of issue 29: with the bus out of room, SIGTERM's checkpoint cannot be written.
    The collection stops at once (before: 116 s), exits 74 (the bus failed: 75 would claim a
    checkpoint that is not there), says why in one line, and ``--resume`` with room finishes."""
    proc = deployment.collect()
    deployment.wait_rows(3, proc)
    asyncio.run(_limit_stream(deployment, 0))
    proc.send_signal(SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 74, stderr
    assert "maximum bytes exceeded" in stderr and "Traceback" not in stderr, stderr
    assert not any('"requeue_checkpoint": "' in line for line in stdout.splitlines())  # none claimed
    asyncio.run(_limit_stream(deployment, None))
    code, out = finish(deployment.collect("--resume"))
    assert code == 0, out
    deployment.each_rollout_once()


def test_a_full_disk_under_the_collector_exits_74_and_resume_finishes_once(
    deployment: Deployment,
) -> None:
    """The collector may not write past a file-size limit (``ulimit -f``, as a full disk would): the
    row that does not fit is never acknowledged, the exit is 74, and ``--resume`` with room finishes."""
    probe = deployment.collect()  # one row, to learn a row's size
    deployment.wait_rows(1, probe)
    probe.send_signal(SIGTERM)
    assert finish(probe)[0] == 75
    row_bytes = deployment.output.stat().st_size // max(1, len(deployment.rows()))
    limit = deployment.output.stat().st_size + 2 * row_bytes + row_bytes // 2  # two more rows and a half

    def small_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    cmd = [sys.executable, "-m", "rollcut", "collect", str(deployment.config), "--json", "--resume"]
    full = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=small_disk
    )
    code, out = finish(full)
    assert code == 74, out
    assert "File too large" in out["stderr"], out  # the disk's own reason, whichever file it hit
    code, out = finish(deployment.collect("--resume"))
    assert code == 0, out
    deployment.each_rollout_once()
