"""Several workers per server: every rollout's requests answered by the worker that holds it.

Each call goes over a fresh connection (a new client per call, as a pool that
opens new connections does), so the kernel spreads them over the workers; the
server must answer as if it had one.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from rollcut.bus import (
    BusConfig,
    EventLog,
    ModelCallAdmitted,
    ModelCallCompleted,
    ResourcesMutated,
    ResourcesSeeded,
    load_credentials,
)
from rollcut.gym import owner_of
from rollcut.gym.wire import SESSION_COOKIE, Identity, identity_headers
from rollcut.replay import count_work
from rollcut.testing import ServerProcess

from .conftest import SIGTERM, Deployment, deploy, finish

pytestmark = pytest.mark.slow

WORKERS = [1, 2, 3]


def _serve(servers: list[ServerProcess], argv: list[str], workers: int, logs: Path) -> ServerProcess:
    srv = ServerProcess([*argv, "--workers", str(workers)], workers=workers, logs=logs).start()
    servers.append(srv)
    return srv


async def _post(url: str, cookies: dict[str, str] | None = None, **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60, cookies=cookies) as fresh:  # a new connection for every call
        return await fresh.post(url, **kw)


def _written_by_owner(events: list[Any], group: str, workers: int) -> set[str]:
    """Every event a rollout's server wrote names the worker that owns the rollout."""
    wrong = {
        f"{e.rollout_id}: {e.instance}"
        for e in events
        if e.instance != f"{group}-w{owner_of(e.rollout_id, workers)}"
    }
    return wrong


@pytest.mark.parametrize("workers", WORKERS)
async def test_resources_sessions_see_their_own_state_whichever_worker_accepts(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess], workers: int
) -> None:
    srv = _serve(
        servers, ["resources", "counter", "--url", nats_url, "--namespace", namespace], workers, tmp_path
    )
    ids = [f"r{i}" for i in range(10)]
    for r in ids:
        await log.dispatch(r, {"t": r}, instance="collector")

    async def episode(rid: str, start: int) -> list[tuple[int, int]]:
        seeded = await _post(
            f"{srv.url}/seed_session", json={"start": start}, headers=identity_headers(Identity(rid, 1))
        )
        assert seeded.status_code == 200, seeded.text
        cookie = {SESSION_COOKIE: seeded.cookies[SESSION_COOKIE]}
        seen = []
        for n in range(1, 7):
            resp = await _post(f"{srv.url}/add", json={"n": n}, cookies=cookie)
            assert resp.status_code == 200, resp.text
            seen.append((resp.json()["result"]["value"], resp.json()["revision"]))
        verdict = await _post(f"{srv.url}/verify", json={"target": start + 21}, cookies=cookie)
        assert verdict.status_code == 200 and verdict.json()["reward"] == 1.0, verdict.text
        return seen

    results = await asyncio.gather(*(episode(r, 10 * i) for i, r in enumerate(ids)))
    for i, seen in enumerate(results):  # each call saw its own session's running total, in order
        total = 10 * i
        assert seen == [(total := total + n, n) for n in range(1, 7)]
    events = [s.event async for s in log.read() if isinstance(s.event, ResourcesSeeded | ResourcesMutated)]
    mutated = Counter((e.rollout_id, e.revision) for e in events if isinstance(e, ResourcesMutated))
    assert set(mutated) == {(r, n) for r in ids for n in range(1, 7)} and max(mutated.values()) == 1
    assert _written_by_owner(events, "counter", workers) == set()
    if workers > 1:  # the rollouts were spread, so connections really met other workers
        assert len({e.instance for e in events}) > 1
    async with httpx.AsyncClient() as c:  # whichever worker answers, it counts for the whole server
        stats = (await c.get(f"{srv.url}/rollcut/stats")).json()
    assert stats["tool_calls_executed"] == 60 and len(stats.get("workers", [stats])) == workers


@pytest.mark.parametrize("workers", WORKERS)
async def test_model_calls_chain_and_retries_join_whichever_worker_accepts(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess], workers: int
) -> None:
    argv = ["model", "--url", nats_url, "--namespace", namespace, "--tokens", str(tmp_path / "tokens")]
    argv += ["--backend-option", "token_delay=0.01"]  # calls take long enough for retries to overlap them
    srv = _serve(servers, argv, workers, tmp_path)
    ids = [f"m{i}" for i in range(6)]
    for r in ids:
        await log.dispatch(r, {"t": r}, instance="collector")

    def client(rid: str) -> openai.AsyncOpenAI:  # the official client; a new one (and connection) per call
        return openai.AsyncOpenAI(
            base_url=f"{srv.url}/v1", api_key="-", default_headers=identity_headers(Identity(rid, 1))
        )

    async def ask(rid: str, messages: list[Any]) -> Any:
        async with client(rid) as c:
            return await c.chat.completions.create(model="rollcut-local", messages=messages)

    async def conversation(rid: str) -> list[str]:
        messages: list[Any] = [{"role": "user", "content": f"hello from {rid}"}]
        calls = []
        for _ in range(3):
            # the same request three times at once (a client's retries): one call, generated once,
            # the others join it or are answered from what it produced
            outs = await asyncio.gather(*(ask(rid, messages) for _ in range(3)))
            ext = [(o.model_extra or {})["rollcut"] for o in outs]
            assert len({e["call_id"] for e in ext}) == 1
            assert sorted(e["served_from_log"] for e in ext) == [False, True, True]
            calls.append(ext[0]["call_id"])
            messages += [
                outs[0].choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "go"},
            ]
        async with client(rid) as c:  # streamed: the answer is forwarded as it is generated
            chunks = [
                x
                async for x in await c.chat.completions.create(
                    model="rollcut-local", messages=messages, stream=True
                )
            ]
        assert chunks and chunks[-1].model_extra is not None
        calls.append(chunks[-1].model_extra["rollcut"]["call_id"])
        return calls

    chains = dict(zip(ids, await asyncio.gather(*(conversation(r) for r in ids)), strict=True))
    events = [
        s.event async for s in log.read() if isinstance(s.event, ModelCallAdmitted | ModelCallCompleted)
    ]
    admitted = Counter(e.call_id for e in events if isinstance(e, ModelCallAdmitted))
    assert max(admitted.values()) == 1  # no call generated twice
    for rid, calls in chains.items():
        parents = {e.call_id: e.parent_call_id for e in events if isinstance(e, ModelCallCompleted)}
        assert [parents[c] for c in calls] == [None, *calls[:-1]], rid  # one conversation, in order
    assert _written_by_owner(events, "model", workers) == set()


@pytest.mark.parametrize("workers", WORKERS)
async def test_episodes_through_every_server_with_k_workers_complete_once(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess], workers: int
) -> None:
    common = ["--url", nats_url, "--namespace", namespace]
    model = _serve(servers, ["model", *common, "--tokens", str(tmp_path / "tokens")], workers, tmp_path)
    counter = _serve(servers, ["resources", "counter", *common], workers, tmp_path)
    agent = _serve(
        servers,
        ["agent", "simple", "--model", model.url, "--resources", f"counter={counter.url}", *common],
        workers,
        tmp_path,
    )
    env = _serve(servers, ["environment", "--agent", agent.url, *common], workers, tmp_path)
    ids = [f"e{i}" for i in range(9)]
    task = {"env": "counter", "prompt": "count up", "seed": {"start": 1}, "max_steps": 8}
    for r in ids:
        await log.dispatch(r, task, instance="collector")
    answers = await asyncio.gather(
        *(_post(f"{env.url}/run", json=task, headers=identity_headers(Identity(r, 1))) for r in ids)
    )
    assert [a.status_code for a in answers] == [200] * len(ids), [a.text[:200] for a in answers]
    assert [a.json()["rollout_id"] for a in answers] == ids
    # a second /run of a running or finished attempt is refused, whichever worker gets it
    rerun = await _post(f"{env.url}/run", json=task, headers=identity_headers(Identity(ids[0], 1)))
    assert rerun.status_code == 409, rerun.text
    events = [s.event async for s in log.read()]
    completed = Counter(e.rollout_id for e in events if type(e).__name__ == "RolloutCompleted")
    assert completed == dict.fromkeys(ids, 1)
    # each server's group by default: the kind, the environment, the agent's kind (issue 54)
    for group, kind in (("model", "model"), ("counter", "resources"), ("simple", "agent")):
        mine = [e for e in events if e.component == kind and e.rollout_id in ids]
        assert mine and _written_by_owner(mine, group, workers) == set(), kind


async def _work(dep: Deployment) -> dict[str, int]:
    log = await EventLog.connect(BusConfig(url=dep.url).as_role(load_credentials(dep.creds), "admin"))
    try:
        return await count_work(log)
    finally:
        await log.close()


def test_a_collection_continues_across_crashes_with_the_worker_counts_changed(tmp_path: Path) -> None:
    with deploy(tmp_path, workers=2) as dep:
        proc = dep.collect()
        for count, rows in ((1, 3), (3, 8)):  # 2 workers, crash, 1, crash, 3
            dep.wait_rows(rows, proc)
            dep.crash()  # SIGKILL every process of every Gym server mid-run
            proc.send_signal(SIGTERM)
            finish(proc)
            dep.stack_options["workers"] = count
            dep.restart()
            assert all(len(p.instances) == count for p in dep.stack)
            proc = dep.collect("--resume")
        code, summary = finish(proc)
        assert code == 0, summary
        dep.each_rollout_once()
        continued = sum(r["attempt"] > 1 for r in dep.rows())
        assert continued >= 1  # episodes went on from their last boundary under other worker counts
        assert asyncio.run(_work(dep))["regenerated_continuing"] == 0


def test_a_dead_worker_of_every_server_is_restarted_and_the_collection_heals(tmp_path: Path) -> None:
    with deploy(tmp_path, workers=2) as dep:
        proc = dep.collect()
        dep.wait_rows(2, proc)
        for server in dep.stack:  # model, each resources server, agent, environment: worker 1 dies
            instance = max(server.instances)
            old = server.instances[instance]
            assert server.kill_worker(instance) != old  # its parent started it again, same name
        code, summary = finish(proc)
        assert code == 0, summary
        dep.each_rollout_once()
        assert all(s.alive() for s in dep.stack)
        assert asyncio.run(_work(dep))["regenerated_continuing"] == 0
