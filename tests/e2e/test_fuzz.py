"""Every route of every Gym server, fuzzed over real HTTP against the server processes.

The routes come from each server's own ``/openapi.json``; hypothesis makes the requests: hostile
identities (in headers, path prefixes and NeMo Gym's encodings), bodies that are arbitrary JSON,
deeply nested JSON, not JSON at all, or a valid example with fields replaced. What a user checks:
no answer is a 5xx, every refusal is OpenAI's error shape with a documented ``type``, and every
server is still alive and answering afterwards.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollcut.bus import BusConfig, EventLog, load_credentials
from rollcut.gym.opaque import REFERENCE_AGENT
from rollcut.gym.resources import ENVIRONMENTS, install_nemo_gym
from rollcut.gym.wire import MESSAGES_ROUTE, ErrorKind, openai_type
from rollcut.testing import ServerProcess

from .conftest import NS, Deployment, deploy

pytestmark = pytest.mark.slow

HOSTILE_IDS = ["a.b", "*", ">", "a b", "../../etc", "x" * 200, "", "%2e%2e", "r\u00e9", "$JS", "a\tb"]
HOSTILE_ATTEMPTS = ["0", "-5", "x", "1.5", "99999999999999999999", "", "+1"]
KNOWN_KINDS = {k.value for k in ErrorKind}
ENVIRONMENT_NAMES = tuple(sorted(ENVIRONMENTS))
NEMO_GYM = "example_session_state_mgmt"  # the NeMo Gym server behind the `nemo-gym` environment here
SPECS = tuple(f"nemo-gym:{NEMO_GYM}" if n == "nemo-gym" else n for n in ENVIRONMENT_NAMES)

EXAMPLES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "hi"}], "model": "rollcut-local"},
    {"input": "hi", "model": "rollcut-local"},
    {"input": [{"role": "user", "content": "hi"}]},
    {"env": "counter", "prompt": "count", "seed": {"start": 0}, "max_steps": 2},
    {"responses_create_params": {"input": "hi"}, "env": "counter"},
    {"n": 1},
    {"task": "hello_file"},
    {"files": {"a.txt": "x"}, "check": "true"},
    {"command": "echo hi", "timeout_s": 1},
    {"path": "a.txt", "content": "x"},
    {},
]
LARGE = [1 << 20, 3 << 20, 15 << 20]  # bodies a record cannot hold, under the 16 MiB body limit

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def _body(draw: st.DrawFn) -> bytes | None:
    how = draw(st.sampled_from(["none", "json", "example", "nested", "bytes", "large"]))
    if how == "none":
        return None
    if how == "large":  # before: any /seed_session body of 1 to 16 MiB was a 500, on every environment
        return b'{"start": 0, "seed": {"junk": "' + b"z" * draw(st.sampled_from(LARGE)) + b'"}}'
    if how == "json":
        return json.dumps(draw(_json)).encode()
    if how == "nested":
        depth = draw(st.integers(100, 20000))
        return ("[" * depth + "]" * depth).encode() if draw(st.booleans()) else ('{"a":' * depth).encode()
    if how == "bytes":
        return draw(st.binary(max_size=64))
    base = dict(draw(st.sampled_from(EXAMPLES)))
    keys = [*base, "model", "messages", "input", "stream", "tools", "task", "files", "timeout_s", "path"]
    for key in draw(st.lists(st.sampled_from(keys))):
        base[key] = draw(_json | st.sampled_from(["nan", "inf", -1, 1e308, ".", "..", {}]))
    return json.dumps(base).encode()


@st.composite
def _identity(draw: st.DrawFn) -> tuple[str, dict[str, str]]:
    """A path prefix and headers: absent, valid, or hostile."""
    # the valid one half the time: a bad body reaches the handlers behind the identity check too
    rid = draw(st.just("fz-ok") | st.sampled_from([*HOSTILE_IDS, "fz-ok", "never-dispatched"]))
    attempt = draw(st.just("1") | st.sampled_from([*HOSTILE_ATTEMPTS, "1", "2"]))
    how = draw(st.sampled_from(["none", "headers", "prefix", "nemo", "cookie"]))
    if how == "headers":
        return "", {"x-rollout-id": rid, "x-rollout-attempt": attempt}
    if how == "prefix":
        return f"/r/{quote(rid, safe='')}/{quote(attempt, safe='')}", {}
    if how == "nemo":
        return f"/ng-rollout/{quote(rid, safe='')}", {}
    if how == "cookie":
        return "", {"cookie": f"rollcut_session={rid}:{attempt}"}
    return "", {}


def _routes(server: ServerProcess) -> list[tuple[str, str]]:
    spec = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
    return [(m.upper(), p) for p, ops in spec["paths"].items() for m in ops]


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("fuzz")  # every environment's server; routing is fuzzed too
    # with their logs: a 5xx's assertion quotes the end of the server's own
    install_nemo_gym()  # NeMo Gym's own server runs behind its participant too (cached once)
    with deploy(root, tasks=[], workers=2, envs=SPECS, logs=root / "logs") as dep:
        asyncio.run(_dispatch(dep, "fz-ok"))  # so valid identities reach the handlers behind the fence
        yield dep


async def _dispatch(dep: Deployment, rollout_id: str) -> None:
    log = await EventLog.connect(
        BusConfig(url=dep.url, namespace=NS).as_role(load_credentials(dep.creds), "admin")
    )
    try:
        await log.dispatch(rollout_id, {"env": "counter"}, instance="fuzz")
    finally:
        await log.close()


@pytest.fixture(scope="module")
def fuzzed_opaque(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """An opaque agent server (the reference agent behind its relay) instead of the Simple Agent."""
    agent = {
        "agent": "opaque",
        "command": f"{sys.executable} {REFERENCE_AGENT}",
        "capability": "replayable_egress",
    }
    with deploy(
        tmp_path_factory.mktemp("fuzz-opaque"), tasks=[], envs=("counter",), agent_options=agent
    ) as dep:
        asyncio.run(_dispatch(dep, "fz-ok"))
        yield dep


@pytest.mark.parametrize("kind", ["model", *ENVIRONMENT_NAMES, "agent", "environment"])
def test_no_route_answers_5xx_and_every_refusal_is_in_the_error_shape(fuzzed: Deployment, kind: str) -> None:
    _fuzz(next(p for p in fuzzed.stack if p.name == (NEMO_GYM if kind == "nemo-gym" else kind)))


def test_the_opaque_agent_and_its_relay_too(fuzzed_opaque: Deployment) -> None:
    _fuzz(next(p for p in fuzzed_opaque.stack if p.name == "agent"))


def _fuzz(server: ServerProcess) -> None:
    routes = _routes(server)
    assert routes, f"{server.name} publishes no routes"
    seen: set[int] = set()

    with httpx.Client(base_url=server.url, timeout=30) as client:

        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(
            route=st.sampled_from(routes),
            tool=st.sampled_from(["add", "run", "write_file", "read_file", "nope", *HOSTILE_IDS[:5]]),
            rest=st.sampled_from(
                ["chat/completions", "responses", "models", "add", "tools", "a/b", "%2e%2e"]
            ),
            ident=_identity(),
            body=_body(),
            ctype=st.sampled_from(["application/json", "text/plain", None]),
        )
        def one(
            route: tuple[str, str],
            tool: str,
            rest: str,
            ident: tuple[str, dict[str, str]],
            body: bytes | None,
            ctype: str | None,
        ) -> None:
            method, path = route
            prefix, headers = ident
            if ctype:
                headers = {**headers, "content-type": ctype}
            name = quote(tool, safe="") or "x"
            url = prefix + path.replace("{tool}", name).replace("{env}", name).replace("{rest}", rest)
            raw = {k: v.encode() for k, v in headers.items()}  # utf-8 bytes: a hostile id need not be ASCII
            resp = client.request(method, url, content=body, headers=raw)
            seen.add(resp.status_code)
            # no checkpoint runs and the disk has room: any 5xx (even a 503) is a bad answer to bad input
            assert resp.status_code < 500, (method, url, body, resp.text, server.tail())
            if resp.status_code >= 400:
                answer = resp.json()
                assert isinstance(answer, dict) and "error" in answer, (
                    resp.status_code,
                    method,
                    url,
                    resp.text,
                )
                err = answer["error"]
                assert isinstance(err["message"], str) and err["message"], resp.text
                if url.split("?")[0].endswith(MESSAGES_ROUTE):  # Anthropic's route, Anthropic's shape
                    assert answer["type"] == "error" and err["type"], resp.text
                    assert err["message"].split(":")[0] in KNOWN_KINDS, resp.text
                else:
                    assert err["code"] in KNOWN_KINDS, resp.text
                    assert err["type"] == openai_type(resp.status_code), resp.text

        one()
    assert any(400 <= s < 500 for s in seen), seen  # the fuzz reached the refusals
    assert server.alive() and httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200
