"""`rollcut report`'s timeline, read from a real stream: every attempt a bar, every crash, what was kept."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollcut.bus import (
    BusConfig,
    CheckpointCommitted,
    CheckpointPrepared,
    CheckpointSealed,
    EventLog,
    ModelCallCompleted,
    RelayReplayed,
    ResultAccepted,
    TokenReceipt,
)
from rollcut.ledger import CheckpointRecord, Ledger
from rollcut.participants import Coordinator, Participant
from rollcut.report import read_timeline, write_report
from rollcut.tokens import LocalTokenStore

from ..helpers import counter_event, until


def _call(rid: str, attempt: int, n: int, tokens: int) -> ModelCallCompleted:
    return ModelCallCompleted(
        component="model",
        instance="model-0",
        rollout_id=rid,
        attempt=attempt,
        call_id=f"{rid}-a{attempt}-c{n}",
        request_digest=f"{n:02x}" * 8,  # the same request in every attempt: turn n's
        receipt=TokenReceipt(receipt_id=f"{rid}-{attempt}-{n}", count=tokens, digest="cd" * 16),
    )


def _accept(rid: str, attempt: int) -> ResultAccepted:
    return ResultAccepted(
        component="collector",
        instance="c-0",
        rollout_id=rid,
        attempt=attempt,
        result_digest="ef" * 8,
        reward=1.0,
    )


async def _checkpoint(log: EventLog, ledger: Ledger, cid: str) -> int:
    """A checkpoint's markers as the coordinator writes them, and its catalog record: its cut."""
    await log.append(
        CheckpointPrepared(component="coordinator", instance="co", checkpoint_id=cid, deadline=0)
    )
    cut = await log.append(CheckpointSealed(component="coordinator", instance="co", checkpoint_id=cid))
    await log.append(CheckpointCommitted(component="coordinator", instance="co", checkpoint_id=cid, cut=cut))
    with ledger.write() as wb:
        wb.put_checkpoint(CheckpointRecord(checkpoint_id=cid, cut=cut))
    return cut


async def _collection(log: EventLog, ledger: Ledger) -> None:
    """Three rollouts: one finishes on attempt 1; a crash interrupts the other two after a checkpoint;
    one continues from the checkpoint's cut, the other starts over from its input."""
    for rid in ("whole", "cont", "over"):
        await log.dispatch(rid, {"prompt": rid}, instance="c-0")
        await log.append(_call(rid, 1, 1, 40))
        await log.append(counter_event(rid, revision=1, delta=2))
    await log.append(_accept("whole", 1))
    cut = await _checkpoint(log, ledger, "ck-1")
    await log.append(_call("cont", 1, 2, 30))  # after the cut: the continuation does not keep it
    await log.append(_call("over", 1, 2, 30))
    # the crash; recovery opens the next attempts
    await log.supersede("cont", 1, instance="c-0", reason="continue", checkpoint_id="ck-1", from_cut=cut)
    await log.supersede("over", 1, instance="c-0", reason="fresh dispatch", from_cut=0)
    await log.append(_call("cont", 2, 2, 30))
    await log.append(_accept("cont", 2))
    await log.append(_call("over", 2, 1, 40))
    await log.append(counter_event("over", revision=1, delta=2, attempt=2))
    await log.append(_call("over", 2, 2, 30))
    await log.append(_accept("over", 2))


@pytest.fixture
async def ledger(log: EventLog, tmp_path: Path) -> AsyncIterator[Ledger]:
    """A ledger beside the log, the three-rollout collection written to both."""
    with Ledger(tmp_path / "ledger") as led:
        await _collection(log, led)
        yield led


async def test_the_timeline_has_every_attempt_the_crash_and_what_each_rollout_kept(
    log: EventLog, ledger: Ledger
) -> None:
    tl = await read_timeline(log, ledger)
    assert tl.rollouts == ["whole", "cont", "over"]
    assert sorted(tl.attempts) == [("cont", 1), ("cont", 2), ("over", 1), ("over", 2), ("whole", 1)]
    assert [a.outcome for a in tl.of("cont")] == ["interrupted", "accepted"]
    assert tl.classes() == {
        "first attempt": 1,
        "continued": 1,
        "started over": 1,
        "retired": 0,
        "unfinished": 0,
    }
    assert len(tl.crashes) == 1 and tl.crashes[0].interrupted == 2 and tl.crashes[0].checkpoint_id == "ck-1"
    # "cont" kept its first call and its tool call (below the cut) and generated the second again;
    # "over" generated both calls and made its tool call again
    w = tl.work
    assert (w["model_calls_kept"], w["tokens_kept"], w["tool_calls_kept"]) == (1, 40, 1)
    assert (w["regenerated"], w["tokens_regenerated"], w["tool_calls_reexecuted"]) == (3, 100, 1)
    assert [c.checkpoint_id for c in tl.checkpoints] == ["ck-1"] and tl.checkpoints[0].recovery
    assert tl.checkpoints[0].ms is not None and tl.checkpoints[0].ms >= 0


async def test_the_page_draws_one_named_bar_per_attempt_and_loads_nothing(
    log: EventLog, ledger: Ledger, tmp_path: Path
) -> None:
    tl = await read_timeline(log, ledger)
    shown = await write_report(log, ledger, tmp_path / "report.html", "HOME")
    html = (tmp_path / "report.html").read_text()
    bars = re.findall(
        r'<rect class="attempt (\w+)" data-rollout="([^"]+)" data-attempt="(\d+)"[^>]*><title>([^<]*)', html
    )
    assert sorted((r, int(a)) for _, r, a, _ in bars) == sorted(tl.attempts)
    for outcome, rid, attempt, title in bars:
        assert title.startswith(f"rollout {rid}, attempt {attempt}: {outcome}")
    # what a later attempt did not keep is hatched: "cont" after the cut, all of "over"'s first attempt
    assert len(re.findall(r'<rect class="lost"', html)) == 2
    assert html.count('class="link"') == 1  # the one continuation, linked to what it continued
    assert html.count('class="cut recovery"') == 1 and html.count('class="crash"') == 1
    assert "<script" not in html and "default-src 'none'" in html  # one file: nothing to load, nothing runs
    assert re.findall(r"(?:src|href)=", html) == []
    assert (tmp_path / "report.html").stat().st_mode & 0o777 == 0o600
    assert shown["attempts"] == 5 and shown["classes"]["continued"] == 1


async def test_an_opaque_agents_replayed_requests_are_counted_on_the_page(
    log: EventLog, ledger: Ledger, tmp_path: Path
) -> None:
    for n in (1, 2):  # "cont"'s attempt 2 answered from its relay's journal,
        await log.append(
            RelayReplayed(
                component="agent",
                instance="a-0",
                rollout_id="cont",
                attempt=2,
                n=n,
                request_digest="ab" * 8,
                source_attempt=1,
            )
        )
    shown = await write_report(log, ledger, tmp_path / "report.html", "HOME")
    assert (shown["work"]["exchanges_replayed"], shown["work"]["divergences"]) == (2, 0)
    html = (tmp_path / "report.html").read_text()
    assert "Opaque agents: 2 requests answered from their relay's journal" in html


async def test_without_opaque_agents_the_page_says_nothing_of_them(
    log: EventLog, ledger: Ledger, tmp_path: Path
) -> None:
    await write_report(log, ledger, tmp_path / "report.html", "HOME")
    assert "Opaque agents" not in (tmp_path / "report.html").read_text()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollcut", *args], capture_output=True, text=True, timeout=60
    )


def test_a_report_of_no_collection_is_refused_and_creates_nothing(tmp_path: Path) -> None:
    done = _cli("report", "--home", str(tmp_path / "nothing-here"))
    assert done.returncode == 2 and "no collection in" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "nothing-here").exists()


def test_the_demo_refuses_a_home_that_already_holds_a_collection(tmp_path: Path) -> None:
    (tmp_path / "ledger").mkdir()
    (tmp_path / "ledger" / "data.mdb").write_bytes(b"keep me")
    done = _cli("demo", "--unpaced", "--rollouts", "2", "--home", str(tmp_path), "--json")
    assert done.returncode == 2 and "already holds a collection" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger"]
    assert (tmp_path / "ledger" / "data.mdb").read_bytes() == b"keep me"


def test_a_week_of_checkpoints_and_rollouts_still_fits_one_page() -> None:
    """Rendering alone, on a timeline as a long collection leaves it: the chart keeps the page's
    width, the cut lines go faint, and no more rollouts are drawn than a page holds."""
    from rollcut.report import MAX_ROWS, Attempt, CheckpointMark, Timeline, render_page

    tl = Timeline(t0=0.0, t1=1000.0)
    for i in range(MAX_ROWS + 20):
        rid = f"r{i}"
        tl.rollouts.append(rid)
        tl.attempts[(rid, 1)] = Attempt(rid, 1, opened=i / 2, start=i / 2, end=i / 2 + 5, outcome="accepted")
    tl.checkpoints = [
        CheckpointMark(f"ck-{k}", cut=k * 10, prepared=k * 2.0, sealed=k * 2.0 + 0.1, committed=k * 2.0 + 0.2)
        for k in range(400)
    ]
    html = render_page(tl, "HOME")
    chart = re.search(r'<svg class="checkpoints" width="(\d+)"', html)
    assert chart is not None and int(chart.group(1)) <= 1060
    assert html.count('class="attempt accepted"') == MAX_ROWS
    assert f"Showing {MAX_ROWS:,} of {MAX_ROWS + 20:,} rollouts" in html
    assert html.count('class="cut many"') == 400


class _SlowExport:
    async def prepare(self, checkpoint_id: str) -> list[str]:
        await asyncio.sleep(0.15)  # a slow state export, on purpose: the prepare it holds up
        return []

    async def restore(self, checkpoint_id: str, cut: int) -> None:
        return None


async def test_the_page_shows_each_checkpoints_pause_by_participant(
    bus_config: BusConfig, tmp_path: Path
) -> None:
    """A real checkpoint (a coordinator, two participants on their own connection, one slow to
    export): the page names whom the pause waited for, and on what, from the stream alone."""
    plog = await EventLog.connect(bus_config, name="participant")
    clog = await EventLog.connect(bus_config, name="coordinator")
    slow = Participant(plog, component="resources", instance="res-slow", mode="exported", hooks=_SlowExport())
    model = Participant(plog, component="model", instance="model-0", mode="event_sourced")
    try:
        await slow.start()
        await model.start()
        with Ledger(tmp_path / "ledger") as led, LocalTokenStore(tmp_path / "tokens") as tokens:
            res = await Coordinator(clog, led, tokens, grace_s=0.3, discovery_idle_s=0.05).checkpoint(
                deadline_s=10
            )

            async def replied() -> bool:
                tl = await read_timeline(clog, led)
                return len(tl.checkpoints[0].inside_ms) == 2

            await until(replied, timeout=10, what="both replies on their lanes")
            tl = await read_timeline(clog, led)
            await write_report(clog, led, tmp_path / "report.html", "HOME")
    finally:
        await slow.stop()
        await model.stop()
        await plog.close()
        await clog.close()
    [mark] = tl.checkpoints
    assert mark.pause_ms == res.pause_ms and mark.waited_ms.keys() == {"res-slow", "model-0"}
    assert mark.inside_ms["res-slow"]["export"] >= 150
    html = (tmp_path / "report.html").read_text()
    assert "Where the pauses went" in html and "The prepare waited for longest: res-slow in 1 (of 1)" in html
    row = re.search(
        rf"<tr><td>{res.record.checkpoint_id}</td><td class='n'>([\d.]+)</td><td>([^<]*)</td>", html
    )
    assert row is not None and float(row.group(1)) == round(res.pause_ms, 1)
    assert row.group(2).startswith(f"res-slow {res.waited_ms['res-slow']['round_trip']:.1f} (drain ")
    assert f"export {mark.inside_ms['res-slow']['export']:.1f})" in row.group(2)
