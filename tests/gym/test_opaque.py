"""The relay's pieces: request normalisation, the lineage's journal, the reference agent's isolation,
and the refusals of an opaque agent server that cannot run (processes: tests/e2e/test_opaque.py)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from rollcut.bus import AttemptOpened, EventLog, RelayExchange
from rollcut.gym import AgentServe, cli_argv
from rollcut.gym.opaque import (
    REFERENCE_AGENT,
    JournalGap,
    RelayRun,
    lineage_journal,
    normalised_route,
    request_digest,
)
from rollcut.gym.wire import Identity

BODY = b'{"model": "policy", "messages": [{"role": "user", "content": "caf\\u00e9"}], "max_tokens": 8}'


def test_two_serialisations_of_one_json_body_are_the_same_request() -> None:
    other = b'{ "max_tokens":8,"messages":[{"content":"caf\xc3\xa9","role":"user"}],\n "model":"policy"}'
    route = "/v1/chat/completions"
    assert request_digest("post", route, BODY, "application/json") == request_digest("POST", route, other)


@pytest.mark.parametrize(
    "change",
    [
        BODY.replace(
            b'"max_tokens": 8', b'"max_tokens": 8, "stream": true'
        ),  # a stream is not a plain answer
        BODY.replace(b"caf", b"Caf"),
        BODY.replace(b'"max_tokens": 8', b'"max_tokens": 9'),
    ],
)
def test_anything_the_body_says_differently_is_another_request(change: bytes) -> None:
    route = "/v1/chat/completions"
    assert request_digest("POST", route, BODY) != request_digest("POST", route, change)


def test_method_route_and_query_order() -> None:
    assert normalised_route("/tools/x/read", "b=2&a=1") == normalised_route("/tools/x/read", "a=1&b=2")
    assert request_digest("GET", "/tools/x/tools", b"") != request_digest("POST", "/tools/x/tools", b"")
    assert request_digest("POST", "/tools/x/add", b"{}") != request_digest("POST", "/tools/x/read", b"{}")
    # a body that is not JSON is taken byte for byte
    assert request_digest("POST", "/r", b"a b") != request_digest("POST", "/r", b"a  b", "text/plain")


def _exchange(rid: str, attempt: int, n: int, body: bytes = b"{}") -> RelayExchange:
    return RelayExchange(
        component="agent",
        instance="agent-w0",
        rollout_id=rid,
        attempt=attempt,
        n=n,
        method="POST",
        route="/v1/chat/completions",
        request_digest=request_digest("POST", "/v1/chat/completions", body),
        status=200,
        content_type="application/json",
        body=body,
    )


async def _continue(log: EventLog, rid: str, attempt: int, cut: int) -> None:
    await log.supersede(rid, attempt - 1, instance="collector", checkpoint_id="ck", from_cut=cut)


async def test_the_journal_follows_the_lineage_and_a_go_live_replaces_the_rest(log: EventLog) -> None:
    await log.dispatch("r", {"prompt": "x"}, instance="collector")
    for n in (1, 2, 3):
        await log.append(_exchange("r", 1, n))
    cut1 = await log.last_seq()
    await log.append(_exchange("r", 1, 4))  # after the cut: never inherited
    await _continue(log, "r", 2, cut1)
    # attempt 2 replayed 1-2, diverged at 3 and went live there (stateless tools), then 4
    await log.append(_exchange("r", 2, 3, b'{"live": 3}'))
    await log.append(_exchange("r", 2, 4, b'{"live": 4}'))
    cut2 = await log.last_seq()
    journal = await lineage_journal(log, "r", cut2)
    assert [(e.attempt, e.n) for e in journal] == [(1, 1), (1, 2), (2, 3), (2, 4)]
    # continued from the first cut again (attempt 2's work after it is not inherited)
    assert [(e.attempt, e.n) for e in await lineage_journal(log, "r", cut1)] == [(1, 1), (1, 2), (1, 3)]


async def test_a_hole_in_the_journal_fails_closed(log: EventLog) -> None:
    await log.dispatch("h", {"prompt": "x"}, instance="collector")
    await log.append(_exchange("h", 1, 1))
    await log.append(_exchange("h", 1, 3))
    with pytest.raises(JournalGap, match="exchange 3 of attempt 1 follows 1"):
        await lineage_journal(log, "h", await log.last_seq())


async def test_a_second_crash_before_the_replacement_went_live_continues_the_first_journal(
    log: EventLog,
) -> None:
    await log.dispatch("s", {"prompt": "x"}, instance="collector")
    for n in (1, 2):
        await log.append(_exchange("s", 1, n))
    cut1 = await log.last_seq()
    await _continue(log, "s", 2, cut1)
    cut2 = await log.last_seq()  # attempt 2 only replayed, then died
    await _continue(log, "s", 3, cut2)
    last = await log.last_on(log.subjects.fence("s"))
    assert isinstance(last.event if last else None, AttemptOpened)
    assert [(e.attempt, e.n) for e in await lineage_journal(log, "s", cut2)] == [(1, 1), (1, 2)]


def test_the_reference_agent_imports_nothing_of_rollcut() -> None:
    tree = ast.parse(REFERENCE_AGENT.read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    roots = {name.split(".")[0] for name in imported}
    assert "rollcut" not in roots and roots - {"__future__"} <= set(sys.stdlib_module_names) | {
        "openai",
        "httpx",
    }


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"command": ""}, "needs --command"),
        ({"command": "agent", "capability": "sandbox_snapshot"}, "needs a sandbox provider"),
        (
            {"command": "agent", "capability": "sandbox_snapshot", "sandbox": "/var/tmp/agents"},
            "names each rollout's with {rollout_id}",
        ),
        (
            {"command": "agent", "capability": "sandbox_snapshot", "sandbox": "tree:/a/{rollout_id}/{who}"},
            "only {rollout_id} and {attempt} are filled in",
        ),
        ({"command": "agent", "sandbox": "nosuch:x"}, "nosuch"),
        ({"command": "agent", "capability": "whatever"}, "unknown capability 'whatever'"),
        ({"command": "agent", "on_divergence": "mix"}, "use fresh_dispatch or go_live"),
        ({"command": "agent", "run_timeout": -1.0}, "--run-timeout -1.0: seconds, 0 for none"),
    ],
)
def test_an_opaque_agent_that_cannot_run_is_refused_before_it_binds(
    options: dict[str, str], says: str
) -> None:
    opts = AgentServe(
        url="nats://127.0.0.1:1",
        agent="opaque",
        model="http://m",
        resources={"counter": "http://r"},
        **options,
    )
    argv = [sys.executable, "-m", "rollcut", "serve", *cli_argv(opts)]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "300"}
    )
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr


def test_a_runs_journal_takes_its_live_exchanges_in_number_order_and_rewinds_to_all_of_them() -> None:
    run = RelayRun(Identity("r", 2), "counter", [_exchange("r", 1, 1), _exchange("r", 1, 2)])
    assert (run.live, run.next_n) == (False, 3)
    run.cursor, run.live = 2, True  # replayed both, went live
    run.kept(_exchange("r", 2, 4))  # stored before 3 (concurrent requests)
    run.kept(_exchange("r", 2, 3))
    assert [(e.attempt, e.n) for e in run.journal] == [(1, 1), (1, 2), (2, 3), (2, 4)]
    run.rewind()  # its program killed: started again, answered from all four
    assert (run.cursor, run.live, run.next_n) == (0, False, 5)
    run.abandon_from(2)  # a go_live divergence at 2 drops 2 and what follows
    assert ([e.n for e in run.journal], run.live, run.next_n) == ([1], True, 2)
