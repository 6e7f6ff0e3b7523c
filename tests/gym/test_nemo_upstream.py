"""NeMo Gym's own resources servers, unmodified, behind rollcut's journal: a session rebuilt at a cut by
giving a fresh upstream session the journaled calls, and a server that answers differently on replay
found at its first differing answer (real NeMo Gym code from its wheel, a real nats-server)."""

from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollcut.bus import EventLog, ResourcesMutated, ResourcesVerified
from rollcut.gym import ResourcesServe
from rollcut.gym.opaque import Normalise
from rollcut.gym.resources import (
    NemoGym,
    NemoGymServer,
    first_difference,
    install_nemo_gym,
    nemo_gym_example_rows,
)

pytestmark = pytest.mark.slow

ROW = {"responses_create_params": {"input": [{"role": "user", "content": "count"}]}}
COUNTER = "example_session_state_mgmt"


@pytest.fixture(scope="module")
def _installed() -> None:
    install_nemo_gym()  # cached after the first run on a machine (about 75 s the first time)


@pytest.fixture
def upstream(_installed: None, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[NemoGymServer]:
    server = NemoGymServer(request.param, log=tmp_path / f"{request.param}.log")
    try:
        yield server.start()
    finally:
        server.kill()


async def _rig(log: EventLog, make_rig: Any, name: str, url: str, **options: Any) -> Any:
    """A resources participant in front of NeMo Gym's server ``name`` at ``url`` (its tools read from
    its OpenAPI document), its coordinator beside it, and rollout ``r1`` dispatched."""
    env = NemoGym(name, url, **options)
    env.discover()
    rig = await make_rig(env)
    await log.dispatch("r1", {}, instance="c")
    return rig


def _journal(events: list[Any], rollout: str) -> list[tuple[str, Any, Any]]:
    return [
        (e.tool, e.arguments, e.result)
        for e in events
        if isinstance(e, ResourcesMutated) and e.rollout_id == rollout and e.attempt == 1
    ]


@pytest.mark.parametrize("upstream", [COUNTER], indirect=True)
async def test_the_counter_is_rebuilt_at_the_cut_by_replay_on_a_fresh_upstream(
    log: EventLog, make_rig: Any, upstream: NemoGymServer
) -> None:
    rig = await _rig(log, make_rig, COUNTER, upstream.url, level="event_sourced")
    env = rig.service.env
    assert {t["function"]["name"] for t in env.tool_schemas()} == {"increment_counter", "get_counter_value"}
    assert (await rig.post("/seed_session", "r1", 1, {**ROW, "initial_count": 3})).status_code == 200
    for n in (4, 2):
        assert (await rig.post("/increment_counter", "r1", 1, {"count": n})).json() == {"success": True}
    assert (await rig.post("/get_counter_value", "r1", 1)).json() == {"count": 9}
    await rig.boundary("r1", COUNTER, 3)
    journal = _journal([s.event async for s in log.read()], "r1")
    assert journal == [
        ("increment_counter", {"count": 4}, {"success": True}),
        ("increment_counter", {"count": 2}, {"success": True}),
        ("get_counter_value", {}, {"count": 9}),
    ]
    upstream.kill()  # the upstream dies with everything it held: the sessions exist only in the journal
    upstream.start()
    await rig.restore_from_checkpoint("r1")
    assert (await rig.post("/get_counter_value", "r1", 2)).json() == {"count": 9}
    assert (await rig.post("/increment_counter", "r1", 2, {"count": 1})).json() == {"success": True}
    verdict = (
        await rig.post("/verify", "r1", 2, {**ROW, "response": _response(), "expected_count": 10})
    ).json()
    assert verdict["reward"] == 1.0  # NeMo Gym's own verdict, read from the rebuilt session
    assert verdict["responses_create_params"]["input"][0]["content"] == "count"
    late = await rig.post("/increment_counter", "r1", 1, {"count": 100})  # attempt 1, after the cut
    assert late.status_code == 409 and late.json()["error"]["code"] == "stale_attempt"


@pytest.mark.parametrize("upstream", ["blackjack"], indirect=True)
async def test_blackjack_declared_replayable_diverges_at_its_first_answer_and_restarts(
    log: EventLog, make_rig: Any, upstream: NemoGymServer
) -> None:
    """NeMo Gym's blackjack deals from an unseeded ``random.Random()``: declared replayable anyway,
    its replay deals other cards, and the continued attempt is refused, naming the call and field
    (three games were dealt: all three the same again by chance is about one in 10**13)."""
    rig = await _rig(log, make_rig, "blackjack", upstream.url, level="event_sourced")
    assert (await rig.post("/seed_session", "r1", 1, ROW)).status_code == 200
    hands = [(await rig.post("/reset", "r1", 1, ROW)).json()["observation"] for _ in range(3)]
    assert all(h.startswith("Your hand: ") for h in hands)
    await rig.boundary("r1", "blackjack", 3)
    await rig.restore_from_checkpoint("r1")
    refused = await rig.post("/step", "r1", 2, {**ROW, "response": _response()})
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "not_continuable"
    assert (
        "blackjack: /reset call" in error["message"] and "answered differently on replay" in error["message"]
    )
    assert "observation" in error["message"]


@pytest.mark.parametrize("upstream", ["blackjack"], indirect=True)
async def test_a_server_declared_nothing_restarts_and_its_checkpoint_says_so(
    log: EventLog, make_rig: Any, upstream: NemoGymServer
) -> None:
    rig = await _rig(log, make_rig, "blackjack", upstream.url)  # its declared level: restart_only
    await rig.post("/seed_session", "r1", 1, ROW)
    await rig.post("/reset", "r1", 1, ROW)
    res = await rig.coordinator.checkpoint(deadline_s=5)
    assert res.unreproducible == {"blackjack-0": ["blackjack: restart_only"]}
    await log.supersede(
        "r1", 1, instance="coordinator", checkpoint_id=res.record.checkpoint_id, from_cut=res.record.cut
    )
    refused = await rig.post("/step", "r1", 2, {**ROW, "response": _response()})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_continuable"


def test_the_journal_names_the_first_differing_field() -> None:
    assert first_difference({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}]}) == "a.1.b: 2 != 3"
    assert first_difference({"a": 1}, {"a": 1, "c": 0}) == "c: in the answer, not the journal"
    assert first_difference([1, 2], [1]) == "the answer: 2 items != 1"
    assert first_difference({"x": 1}, {"x": 1}) is None
    assert first_difference(1, 1.0) == "the answer: 1 != 1.0"


def test_nemo_gym_list_gives_every_server_and_agent_of_the_wheel_a_level(_installed: None) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rollcut", "nemo-gym", "list", "--json"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    levels = json.loads(out.stdout)
    servers = {x["name"]: x for x in levels if x["kind"] == "resources_server"}
    agents = {x["name"] for x in levels if x["kind"] == "agent"}
    assert servers[COUNTER]["level"] == "replayable" and servers["example_multi_step"]["level"] == "stateless"
    assert servers["blackjack"]["level"] == "restart_only" and "random" in servers["blackjack"]["why"]
    assert {"simple_agent", "gymnasium_agent"} <= agents
    judge = servers["equivalence_llm_judge"]  # read from its own config, named by the key that says so
    assert judge["level"] == "cannot_run_here" and "judge_model_server" in judge["why"]
    search = servers["tavily_search"]
    assert "tavily_api_key" in search["why"] and "tavily-python" in search["why"]
    assert len(servers) > 100 and len(agents) > 40  # the wheel's whole catalogue, not a sample
    assert all(x["why"] for x in levels)


def test_the_docs_catalogue_is_what_the_command_prints(_installed: None) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rollcut", "nemo-gym", "list", "--markdown"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    page = Path(__file__).parents[2] / "docs" / "nemo-gym-catalogue.md"
    assert out.stdout == page.read_text(), "regenerate it: rollcut nemo-gym list --markdown"


def _response(text: str | None = None) -> dict[str, Any]:
    """The smallest Response NeMo Gym's verify takes (no output: the counter reads its session), or
    one whose output is a message saying ``text``."""
    message = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return {
        "id": "resp_1",
        "created_at": 0,
        "model": "m",
        "object": "response",
        "output": [message] if text is not None else [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


@pytest.mark.parametrize("upstream", ["mcqa"], indirect=True)
async def test_a_stateless_verifiers_verdict_is_journaled_and_never_computed_again(
    log: EventLog, make_rig: Any, upstream: NemoGymServer
) -> None:
    """NeMo Gym's mcqa grades a row by its own rules: its verdict is journaled before it goes back,
    and the continued attempt that asks again at the same revision with the same request gets that
    verdict from the journal, with nothing left that could compute it (the upstream is dead). A
    different request is asked of the upstream, and its death is a clear error, not a guess."""
    row = json.loads(nemo_gym_example_rows("mcqa")[0])
    rig = await _rig(log, make_rig, "mcqa", upstream.url, level="stateless")
    assert (await rig.post("/seed_session", "r1", 1, row)).status_code == 200
    right = {**row, "response": _response("\\boxed{" + row["expected_answer"] + "}")}
    first = await rig.post("/verify", "r1", 1, right)
    assert first.status_code == 200 and first.json()["reward"] == 1.0, first.text
    await rig.restore_from_checkpoint("r1")
    upstream.kill()
    again = await rig.post("/verify", "r1", 2, right)
    assert again.status_code == 200 and again.json() == first.json()
    other = await rig.post("/verify", "r1", 2, {**row, "response": _response("\\boxed{Z}")})
    assert other.status_code == 502 and "did not answer /verify" in other.json()["error"]["message"]
    verdicts = [
        (e.attempt, e.revision, e.from_log, e.verdict["reward"])
        for e in [s.event async for s in log.read()]
        if isinstance(e, ResourcesVerified)
    ]
    assert verdicts == [(1, 0, False, 1.0), (2, 0, True, 1.0)]


@pytest.mark.parametrize("upstream", [COUNTER], indirect=True)
@pytest.mark.parametrize("boundary", [0, 1, 3])
async def test_calls_after_the_last_boundary_are_answered_from_the_journal_and_sessions_stay_apart(
    log: EventLog, make_rig: Any, upstream: NemoGymServer, boundary: int
) -> None:
    """The continuing agent sends again what its attempt did after its last boundary: answered from the
    journal, in order, on a session rebuilt beside another live one of the same upstream (each
    session its own cookie: a second seed is never the first session again)."""
    rig = await _rig(log, make_rig, COUNTER, upstream.url, level="event_sourced")
    await log.dispatch("other", {}, instance="c")
    for rid in ("r1", "other"):
        await rig.post("/seed_session", rid, 1, {**ROW, "initial_count": 0})
    await rig.post("/increment_counter", "other", 1, {"count": 50})
    calls = [
        ("/get_counter_value", {}),
        ("/increment_counter", {"count": 1}),
        ("/increment_counter", {"count": 2}),
    ]
    assert [(await rig.post(p, "r1", 1, b)).json() for p, b in calls] == [
        {"count": 0},
        {"success": True},
        {"success": True},
    ]
    await rig.boundary("r1", COUNTER, boundary)
    await rig.restore_from_checkpoint("r1")
    again = [await rig.post(p, "r1", 2, b) for p, b in calls[boundary:]]
    assert [r.json() for r in again] == [{"count": 0}, {"success": True}, {"success": True}][boundary:]
    assert all(r.headers["x-rollcut-served-from-log"] == "True" for r in again)
    verdict = (
        await rig.post("/verify", "r1", 2, {**ROW, "response": _response(), "expected_count": 3})
    ).json()
    assert verdict["reward"] == 1.0
    assert (await rig.post("/get_counter_value", "other", 1)).json() == {"count": 50}


@pytest.mark.parametrize("upstream", [COUNTER], indirect=True)
async def test_an_upstream_that_dies_is_a_clear_error_and_the_journal_keeps_what_it_had(
    log: EventLog, make_rig: Any, upstream: NemoGymServer
) -> None:
    rig = await _rig(log, make_rig, COUNTER, upstream.url, level="event_sourced")
    await rig.post("/seed_session", "r1", 1, {**ROW, "initial_count": 2})
    await rig.post("/increment_counter", "r1", 1, {"count": 3})
    before = _journal([s.event async for s in log.read()], "r1")
    upstream.kill()
    dead = await rig.post("/increment_counter", "r1", 1, {"count": 4})
    assert dead.status_code == 502, dead.text
    error = dead.json()["error"]
    assert (
        error["code"] == "http_error" and "the upstream did not answer /increment_counter" in error["message"]
    )
    assert _journal([s.event async for s in log.read()], "r1") == before  # nothing lost, nothing added
    upstream.start()
    # applied or not, the live session cannot be shown to be the journal's any more: never continued
    broken = await rig.post("/get_counter_value", "r1", 1)
    assert broken.status_code == 409 and broken.json()["error"]["code"] == "not_continuable"
    # at a cut, a fresh session is rebuilt from the journal: the call that got no answer was not made
    await rig.boundary("r1", COUNTER, 1)
    await rig.restore_from_checkpoint("r1")
    assert (await rig.post("/get_counter_value", "r1", 2)).json() == {"count": 5}


class _TestUpstream(http.server.BaseHTTPRequestHandler):
    """An upstream written here that publishes one tool, ``/poke``, and answers garbage, nothing at
    all, or (``stamping``) what it was sent with the id of the process it runs as (``boot``), as a
    server that numbers its processes or stamps its answers does."""

    hang = threading.Event()  # set when the test ends: the handler that hangs returns

    def do_GET(self) -> None:
        body = json.dumps({"paths": {"/poke": {"post": {}}}, "components": {}}).encode()
        self._answer(200, body, "application/json")

    def do_POST(self) -> None:
        sent = self.rfile.read(int(self.headers.get("content-length") or 0))
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "hang":
            self.hang.wait(30)
            return
        if mode == "stamping":
            answer = {"echo": json.loads(sent or b"{}"), "process": self.server.boot}  # type: ignore[attr-defined]
            self._answer(200, json.dumps(answer).encode(), "application/json")
            return
        self._answer(200, b"\x00<html>not json", "text/html")

    def _answer(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("set-cookie", "s=1")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


@contextlib.contextmanager
def _test_upstream(mode: str) -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TestUpstream)
    server.mode, server.boot = mode, "process-1"  # type: ignore[attr-defined]
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        _TestUpstream.hang.set()
        server.shutdown()
        thread.join(timeout=10)
        _TestUpstream.hang.clear()


@pytest.mark.parametrize("mode", ["garbage", "hang"])
async def test_an_upstream_answering_garbage_or_nothing_is_a_clear_error_and_stores_nothing(
    log: EventLog, make_rig: Any, mode: str
) -> None:
    with _test_upstream(mode) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        rig = await _rig(log, make_rig, "misbehaving", url, timeout_s=1.0)
        refused = await rig.post("/seed_session", "r1", 1, ROW)
        assert refused.status_code == (504 if mode == "hang" else 502), refused.text
        error = refused.json()["error"]
        assert error["code"] == "http_error" and error["type"] == "server_error"
        assert (
            "did not answer /seed_session within 1 s" if mode == "hang" else "answered /seed_session"
        ) in error["message"]
        assert not [s async for s in log.read() if getattr(s.event, "rollout_id", None) == "r1"][1:]


@pytest.mark.parametrize("normalise", [[], ["process"]])
async def test_a_value_that_changes_per_process_is_compared_unless_declared_normalised(
    log: EventLog, make_rig: Any, normalise: list[str]
) -> None:
    """A server whose answers name the process they ran in answers differently when replayed on a
    new one: undeclared, that is a divergence naming the field (the rollout starts over); declared
    (``--normalise process``), the rest of the answer is still compared and the session continues."""
    with _test_upstream("stamping") as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        rig = await _rig(
            log, make_rig, "stamping", url, level="event_sourced", normalise=Normalise(normalise)
        )
        await rig.post("/seed_session", "r1", 1, {})
        first = await rig.post("/poke", "r1", 1, {"n": 1})
        assert first.json() == {"echo": {"n": 1}, "process": "process-1"}
        await rig.boundary("r1", "stamping", 1)
        server.boot = "process-2"  # type: ignore[attr-defined]  # the upstream started again
        await rig.restore_from_checkpoint("r1")
        after = await rig.post("/poke", "r1", 2, {"n": 2})
        if normalise:
            assert after.status_code == 200 and after.json() == {"echo": {"n": 2}, "process": "process-2"}
        else:
            assert after.status_code == 409, after.text
            error = after.json()["error"]
            assert error["code"] == "not_continuable"
            assert (
                "stamping: /seed_session answered differently on replay (process: 'process-1' != 'process-2')"
                in (error["message"])
            )


def test_a_normalised_field_is_left_out_of_the_comparison_and_nothing_else() -> None:
    rule = Normalise(["meta.id", "stamp~[0-9]+"])
    journaled = {"count": 3, "meta": {"id": "a"}, "stamp": "at 17 s"}
    assert (
        first_difference(journaled, {"count": 3, "meta": {"id": "b"}, "stamp": "at 18 s"}, normalise=rule)
        is None
    )
    assert first_difference(
        journaled, {"count": 4, "meta": {"id": "b"}, "stamp": "at 18 s"}, normalise=rule
    ) == ("count: 3 != 4")
    assert journaled == {"count": 3, "meta": {"id": "a"}, "stamp": "at 17 s"}  # compared on copies


async def test_the_server_it_started_is_started_again_and_its_old_sessions_are_never_used(
    log: EventLog, make_rig: Any, _installed: None, tmp_path: Path
) -> None:
    env = NemoGym.of(ResourcesServe(url="nats://unused", env="nemo-gym", server=COUNTER))
    assert env.child is not None and env.mode == "event_sourced"
    try:
        rig = await make_rig(env)
        for rid in ("r1", "r2"):
            await log.dispatch(rid, {}, instance="c")
        await rig.post("/seed_session", "r1", 1, {**ROW, "initial_count": 7})
        env.child.kill()  # the NeMo Gym process dies under a live session
        refused = await rig.post("/get_counter_value", "r1", 1)
        assert refused.status_code == 409, refused.text
        assert "its upstream was restarted" in refused.json()["error"]["message"]
        assert env.child.alive() and env.generation == 1
        await rig.post("/seed_session", "r2", 1, {**ROW, "initial_count": 4})  # a new one is served
        assert (await rig.post("/get_counter_value", "r2", 1)).json() == {"count": 4}
    finally:
        env.child.kill()
