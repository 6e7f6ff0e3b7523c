"""Opaque agents across crashes: the reference agent (its own program, the openai SDK) behind the relay.

Every Gym server is a process; the opaque agent's program is a child of the agent server's
worker; SIGKILL takes the agent server (the program and the relay with it), or every Gym
process. The continued attempt must be answered from the journal for everything the lineage
completed (nothing generated or executed again) and finish exactly as an uninterrupted run.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollcut.bus import (
    ModelCallAdmitted,
    ModelCallCompleted,
    ModelCallContinued,
    ModelCallPrefixCut,
    RelayDiverged,
    RelayExchange,
    RelayReplayed,
    ResourcesMutated,
)
from rollcut.demo import demo_tasks
from rollcut.gym.opaque import REFERENCE_AGENT

from ..helpers import until
from .conftest import Deployment, deploy, finish
from .episodes import Episodes, episodes
from .faults import cli

pytestmark = pytest.mark.slow

# turn 2 ends with the agent thinking for a while: exchanges 1-5 are done (its tool list, two model
# calls, two tool calls), and a kill then is mid-episode
TASK = {
    "id": "opaque",
    "env": "counter",
    "prompt": "Count upwards from 3, then say the total.",
    "seed": {"start": 3},
    "verify": {},
    "max_steps": 12,
    "pause_after_turn": 2,
    "pause_s": 2.0,
}
DONE_BEFORE_PAUSE = 5


def opaque_agent(**more: Any) -> dict[str, Any]:
    """The agent server's options: the reference agent behind the relay (and ``more``)."""
    return {"agent": "opaque", "command": f"{sys.executable} {REFERENCE_AGENT}", **more}


def opaque_stack(root: Path, token_delay: float = 0.002) -> Any:
    return deploy(
        root,
        token_delay=token_delay,
        tool_turns=4,
        envs=("counter",),
        agent_options=opaque_agent(capability="replayable_egress"),
    )


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Deployment]:
    with opaque_stack(tmp_path) as dep:
        yield dep


@pytest.fixture
async def ep(stack: Deployment) -> AsyncIterator[Episodes]:
    async with episodes(stack) as e:
        yield e


async def kinds(ep: Episodes, rid: str, attempt: int, kind: type) -> list[Any]:
    return [e for _, e in await ep.events(rid, attempt) if isinstance(e, kind)]


async def run_until_paused(ep: Episodes, rid: str, task: dict[str, Any]) -> asyncio.Future[httpx.Response]:
    await ep.log.dispatch(rid, task, instance="collector")
    run = ep.start_run(rid, 1, task)

    async def thinking() -> bool:
        return len(await kinds(ep, rid, 1, RelayExchange)) >= DONE_BEFORE_PAUSE

    await until(thinking, timeout=60, what=f"{DONE_BEFORE_PAUSE} exchanges of {rid}")
    return run


def agent_program(ep: Episodes) -> int:
    """The pid of the reference agent's program running under the agent server's workers."""
    workers = set(next(p for p in ep.dep.stack if p.name == "agent").pids)
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # not a process, or gone meanwhile
        if ppid in workers and REFERENCE_AGENT.name.encode() in cmdline:
            found.append(int(proc.name))
    assert len(found) == 1, found
    return found[0]


async def agent_restarts(ep: Episodes) -> int:
    agent = next(p for p in ep.dep.stack if p.name == "agent").url
    return int((await ep.http.get(f"{agent}/rollcut/stats")).json()["agent_restarts"])


async def continued(ep: Episodes, rid: str, attempt: int, task: dict[str, Any]) -> dict[str, Any]:
    resp = await ep.post_run(rid, attempt, task)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


async def assert_nothing_done_twice(ep: Episodes, rid: str) -> None:
    assert await ep.regenerated(rid) == []  # no model call generated again
    assert await ep.reapplied(rid) == []  # no tool call executed again


def same_episode(out: dict[str, Any], ref: dict[str, Any]) -> None:
    assert out["continued"] is True
    assert (out["answer"], out["verified"], out["turns"]) == (ref["answer"], ref["verified"], ref["turns"])
    # the agent's own state: every message it saw and sent, hashed by the agent itself
    assert out["agent"]["state"] == ref["agent"]["state"]
    assert out["agent"]["notes"] == ref["agent"]["notes"]


async def test_the_agent_server_killed_mid_episode_is_replayed_from_the_journal(ep: Episodes) -> None:
    ref = await ep.reference(TASK)
    await run_until_paused(ep, "r", TASK)
    done = await kinds(ep, "r", 1, RelayExchange)
    ep.dep.crash_one("agent")  # its workers, the relay in them, the agent's program
    await ep.runs_broken_off()
    ck = await ep.checkpoint()  # the tail: everything durable before the kill
    attempt = await ep.continue_from("r", ck)
    out = await continued(ep, "r", attempt, TASK)
    same_episode(out, ref)
    replayed = await kinds(ep, "r", attempt, RelayReplayed)
    assert [e.n for e in replayed] == [e.n for e in done] == list(range(1, len(done) + 1))
    assert {e.source_attempt for e in replayed} == {1}
    # what attempt 2 did live starts where the journal ended, numbered on
    live = await kinds(ep, "r", attempt, RelayExchange)
    assert [e.n for e in live] == list(range(len(done) + 1, len(done) + 1 + len(live)))
    assert len(done) + len(live) == len(await kinds(ep, "reference", 1, RelayExchange))
    await assert_nothing_done_twice(ep, "r")
    # the model server generated, in attempt 2, only calls the journal did not hold
    calls_1 = await kinds(ep, "r", 1, ModelCallCompleted)
    calls_2 = await kinds(ep, "r", attempt, ModelCallCompleted)
    assert len(calls_1) + len(calls_2) == len(await kinds(ep, "reference", 1, ModelCallCompleted))
    # the result names every model call of the episode by its receipt, across both attempts, in order:
    # the replayed ones are attempt 1's calls, the rest attempt 2's; each resolves in the token store
    receipts = out["rollcut"]["model_calls"]
    assert [c["call_id"] for c in receipts] == [e.call_id for e in calls_1 + calls_2]
    for call, ev in zip(receipts, calls_1 + calls_2, strict=True):
        assert (call["receipt_id"], call["receipt_digest"]) == (ev.receipt.receipt_id, ev.receipt.digest)
        assert len(ep.tokens.get(ev.receipt).output_ids) == call["receipt_count"] > 0


async def test_every_gym_process_killed_then_a_second_crash_during_the_replay(ep: Episodes) -> None:
    ref = await ep.reference(TASK)
    await run_until_paused(ep, "r", TASK)
    done = len(await kinds(ep, "r", 1, RelayExchange))
    await ep.crash()
    ep.dep.restart(same_ports=True)
    ck = await ep.checkpoint()
    a2 = await ep.continue_from("r", ck)
    ep.start_run("r", a2, TASK)

    async def replaying_and_thinking() -> bool:  # attempt 2 replayed the journal and thinks again
        return len(await kinds(ep, "r", a2, RelayReplayed)) >= done

    await until(replaying_and_thinking, timeout=60, what="attempt 2 replaying")
    assert await kinds(ep, "r", a2, RelayExchange) == []  # nothing live yet
    await ep.crash()
    ep.dep.restart(same_ports=True)
    ck2 = await ep.checkpoint()
    a3 = await ep.continue_from("r", ck2)
    out = await continued(ep, "r", a3, TASK)
    same_episode(out, ref)
    replayed = await kinds(ep, "r", a3, RelayReplayed)
    # attempt 3 continues attempt 1 through attempt 2: the same journal, from its first writer
    assert [e.n for e in replayed] == list(range(1, done + 1))
    assert {e.source_attempt for e in replayed} == {1}
    await assert_nothing_done_twice(ep, "r")


async def test_a_checkpoint_taken_while_the_agent_thinks_publishes_and_is_continued(ep: Episodes) -> None:
    ref = await ep.reference(TASK)
    await run_until_paused(ep, "r", TASK)
    before = len(await kinds(ep, "r", 1, RelayExchange))
    ck = await ep.checkpoint()  # the agent is thinking: nothing to wait for, nothing it must reach
    assert len(await kinds(ep, "r", 1, RelayExchange)) == before  # it published before the agent moved
    assert not await ep.finished("r")
    await ep.crash()
    ep.dep.restart(same_ports=True)
    attempt = await ep.continue_from("r", ck)  # that checkpoint, not a tail sealed after the crash
    out = await continued(ep, "r", attempt, TASK)
    same_episode(out, ref)
    assert len(await kinds(ep, "r", attempt, RelayReplayed)) == before
    await assert_nothing_done_twice(ep, "r")


async def test_a_nondeterministic_agent_diverges_and_starts_over_with_no_mixed_history(ep: Episodes) -> None:
    task = {**TASK, "nonce": True}
    await run_until_paused(ep, "r", task)
    await ep.crash()
    ep.dep.restart(same_ports=True)
    ck = await ep.checkpoint()
    a2 = await ep.continue_from("r", ck)
    resp = await ep.post_run("r", a2, task)
    assert resp.status_code == 409, resp.text
    assert resp.json()["error"]["code"] == "fresh_dispatch"
    (diverged,) = await kinds(ep, "r", a2, RelayDiverged)
    # its first model request after a tool round carries the nonce: request 4 (tools, model, tool, model)
    assert diverged.n == 4 and diverged.policy == "fresh_dispatch"
    assert [e.n for e in await kinds(ep, "r", a2, RelayReplayed)] == [1, 2, 3]
    # an operator sees the same in `rollcut replay --json`: what the relay replayed and where it diverged
    shown = await asyncio.to_thread(cli, ep.dep, "replay", "--rollout", "r")
    assert shown.returncode == 0, shown.stderr[-2000:]
    attempts = json.loads(shown.stdout)["rollouts"]["r"]["attempts"]
    relay = attempts[str(a2)]["sessions"]["agent"]
    assert relay["relay_replayed"] == 3 and relay["relay_exchanges"] == 0
    assert [(d["n"], d["policy"]) for d in relay["relay_diverged"]] == [(4, "fresh_dispatch")]
    assert attempts["1"]["sessions"]["agent"]["relay_exchanges"] >= 3
    # nothing of attempt 2 went live: no exchange, no generation, no tool call
    for kind in (RelayExchange, ModelCallCompleted, ResourcesMutated):
        assert await kinds(ep, "r", a2, kind) == []
    # the framework's fallback: the next attempt from the input, which runs whole and replays nothing
    a3 = await ep.fresh_dispatch("r")
    resp = await ep.post_run("r", a3, task)
    assert resp.status_code == 200, resp.text
    assert resp.json()["continued"] is False
    assert await kinds(ep, "r", a3, RelayReplayed) == []


async def test_the_relay_answers_only_an_attempt_running_on_it(ep: Episodes) -> None:
    agent = next(p for p in ep.dep.stack if p.name == "agent").url
    body = {"model": "rollcut-local", "messages": [{"role": "user", "content": "hi"}]}
    await ep.log.dispatch("idle", TASK, instance="collector")  # dispatched, but no agent runs it
    for path in (
        "/r/idle/1/v1/chat/completions",
        "/r/idle/1/tools/counter/add",
        "/r/nobody/1/tools/counter/add",
    ):
        resp = await ep.http.post(f"{agent}{path}", json=body)
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "stale_attempt", resp.text
    resp = await ep.http.post(f"{agent}/v1/chat/completions", json=body, headers={"x-rollout-id": "idle"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "missing_identity"
    assert [e for _, e in await ep.events("idle") if not isinstance(e, type(None))][
        1:
    ] == []  # the dispatch only


@pytest.fixture
def undeclared(tmp_path: Path) -> Iterator[Deployment]:
    """The same agent, its runtime declaring no capability."""
    with deploy(tmp_path, tool_turns=4, envs=("counter",), agent_options=opaque_agent()) as dep:
        yield dep


async def test_an_agent_that_declares_nothing_is_restart_only(undeclared: Deployment) -> None:
    async with episodes(undeclared) as ep:
        await run_until_paused(ep, "r", TASK)
        await ep.crash()
        ep.dep.restart(same_ports=True)
        a2 = await ep.continue_from("r", await ep.checkpoint())
        resp = await ep.post_run("r", a2, TASK)
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "fresh_dispatch"
        assert "restart_only" in resp.json()["error"]["message"]
        # fail closed: nothing of the journal was replayed, nothing went live
        for kind in (RelayReplayed, RelayExchange, ModelCallCompleted):
            assert await kinds(ep, "r", a2, kind) == []
        a3 = await ep.fresh_dispatch("r")
        resp = await ep.post_run("r", a3, TASK)
        assert resp.status_code == 200 and resp.json()["continued"] is False


@pytest.fixture
def slow_tokens(tmp_path: Path) -> Iterator[Deployment]:
    """The same deployment with generations long enough to be cut by a checkpoint."""
    with opaque_stack(tmp_path, token_delay=0.03) as dep:
        yield dep


async def test_a_model_call_running_at_a_checkpoint_continues_from_its_cut(slow_tokens: Deployment) -> None:
    task = {k: v for k, v in TASK.items() if not k.startswith("pause")}
    async with episodes(slow_tokens) as ep:
        ref = await ep.reference(task)
        await ep.log.dispatch("r", task, instance="collector")
        ep.start_run("r", 1, task)

        async def generating() -> bool:  # its second model call is admitted and not finished
            evs = [e for _, e in await ep.events("r", 1)]
            admitted = [e.call_id for e in evs if isinstance(e, ModelCallAdmitted)]
            done = {e.call_id for e in evs if isinstance(e, ModelCallCompleted)}
            return len(admitted) >= 2 and admitted[-1] not in done

        await until(generating, timeout=60, what="a second model call generating")
        ck = await ep.checkpoint()  # the relay answers at once; the model server cuts the call
        await ep.crash()
        (cut,) = await kinds(ep, "r", 1, ModelCallPrefixCut)
        assert cut.token_boundary > 0
        ep.dep.restart(same_ports=True)
        attempt = await ep.continue_from("r", ck)
        out = await continued(ep, "r", attempt, task)
        same_episode(out, ref)
        # the replayed agent sent the cut call again past the journal's end: it went on from its prefix
        (cont,) = await kinds(ep, "r", attempt, ModelCallContinued)
        assert (cont.source_call_id, cont.token_boundary) == (cut.call_id, cut.token_boundary)
        assert len(await kinds(ep, "r", attempt, RelayReplayed)) >= 3  # tools, model call 1, its tool call
        await assert_nothing_done_twice(ep, "r")


async def test_a_retired_rollout_stops_its_agent(ep: Episodes) -> None:
    run = await run_until_paused(ep, "r", TASK)
    done = len(await kinds(ep, "r", 1, RelayExchange))
    await ep.log.retire("r", instance="collector", reason="over budget")
    resp = await run  # the launcher stops the agent; nothing more of it reaches the log
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "retired", resp.text
    assert len(await kinds(ep, "r", 1, RelayExchange)) == done


async def test_the_agents_program_killed_alone_is_started_again_within_its_attempt(ep: Episodes) -> None:
    ref = await ep.reference(TASK)
    run = await run_until_paused(ep, "r", TASK)
    done = await kinds(ep, "r", 1, RelayExchange)
    os.kill(agent_program(ep), signal.SIGKILL)  # the OOM killer's way: the relay and the servers live on
    resp = await run
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert (out["answer"], out["verified"], out["turns"]) == (ref["answer"], ref["verified"], ref["turns"])
    assert out["agent"]["state"] == ref["agent"]["state"] and out["continued"] is False
    # the same attempt: its program, started again from its input, was answered from the journal
    replayed = await kinds(ep, "r", 1, RelayReplayed)
    assert [e.n for e in replayed] == [e.n for e in done] and {e.source_attempt for e in replayed} == {1}
    assert await agent_restarts(ep) == 1
    await assert_nothing_done_twice(ep, "r")


async def test_a_call_in_flight_when_the_program_dies_is_journaled_and_not_generated_again(
    slow_tokens: Deployment,
) -> None:
    task = {k: v for k, v in TASK.items() if not k.startswith("pause")}
    async with episodes(slow_tokens) as ep:
        ref = await ep.reference(task)
        await ep.log.dispatch("r", task, instance="collector")
        run = ep.start_run("r", 1, task)

        async def generating() -> bool:
            evs = [e for _, e in await ep.events("r", 1)]
            admitted = [e.call_id for e in evs if isinstance(e, ModelCallAdmitted)]
            done = {e.call_id for e in evs if isinstance(e, ModelCallCompleted)}
            return len(admitted) >= 2 and admitted[-1] not in done

        await until(generating, timeout=60, what="a second model call generating")
        os.kill(agent_program(ep), signal.SIGKILL)
        resp = await run
        assert resp.status_code == 200, resp.text
        assert resp.json()["agent"]["state"] == ref["agent"]["state"]
        # the call the dead program was waiting for ran to its end upstream, was journaled, and the
        # program started again got it from the journal: every model call generated once
        generated = await kinds(ep, "r", 1, ModelCallCompleted)
        assert len(generated) == len(await kinds(ep, "reference", 1, ModelCallCompleted))
        assert len(await kinds(ep, "r", 1, RelayReplayed)) >= 3
        await assert_nothing_done_twice(ep, "r")


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[Deployment]:
    """The agent server with a limit on one run of the program."""
    agent = opaque_agent(capability="replayable_egress", run_timeout=8.0)  # room on a loaded machine
    with deploy(tmp_path, tool_turns=4, envs=("counter",), agent_options=agent) as dep:
        yield dep


async def test_a_program_over_its_time_limit_is_stopped_and_its_run_fails(limited: Deployment) -> None:
    async with episodes(limited) as ep:
        run = await run_until_paused(ep, "r", {**TASK, "pause_s": 600.0})  # it would think for ten minutes
        resp = await run
        assert resp.status_code == 502 and resp.json()["error"]["code"] == "agent_failed", resp.text
        assert "--run-timeout" in resp.json()["error"]["message"]
        with pytest.raises(AssertionError):  # its program is gone, not left thinking
            agent_program(ep)
        stats = (
            await ep.http.get(f"{next(p for p in ep.dep.stack if p.name == 'agent').url}/rollcut/stats")
        ).json()
        assert stats["runs_timed_out"] == 1 and stats["running"] == 0


COUNTING = demo_tasks(8, 0, ("counter",))


@pytest.fixture
def collection(tmp_path: Path) -> Iterator[Deployment]:
    agent = opaque_agent(capability="replayable_egress")
    with deploy(tmp_path, COUNTING, tool_turns=3, envs=("counter",), agent_options=agent) as dep:
        yield dep


def test_an_opaque_collection_exports_every_model_call_to_the_trainer(collection: Deployment) -> None:
    """`rollcut collect` then `rollcut export`, as a trainer's pipeline would: an opaque agent's rows name
    their model calls' receipts, and the export reads each call's arrays from the token store."""
    code, summary = finish(collection.collect())
    assert code == 0 and summary["results_written"] == len(COUNTING), summary
    rows = collection.rows()
    calls = sum(len(r["rollcut"]["model_calls"]) for r in rows)
    assert calls == 4 * len(COUNTING)  # three tool rounds and the answer, each one call
    out = collection.root / "turns.jsonl"
    argv = ["export", str(collection.output), "--home", str(collection.root), "--out", str(out), "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "rollcut", *argv], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["turns"] == calls
    turns = [json.loads(line) for line in out.read_text().splitlines()]
    assert {t["rollout_id"] for t in turns} == {r["rollout_id"] for r in rows}
    for t in turns:  # the policy's tokens masked in, its prompt out
        assert len(t["input_ids"]) == len(t["mask"]) == len(t["log_probs"]) and 0 < sum(t["mask"]) < len(
            t["mask"]
        )
