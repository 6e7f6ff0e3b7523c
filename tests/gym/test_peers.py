"""Which rollout a request names, for routing it to the worker that holds the rollout."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollcut.gym import Peers, owner_of
from rollcut.gym._http import gym_app
from rollcut.gym._peers import routing_key
from rollcut.gym.wire import Identity, ng_path_id, session_cookie


def _scope(path: str = "/add", headers: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "type": "http",
        "path": path,
        "headers": [(k.encode(), v.encode()) for k, v in (headers or {}).items()],
    }


@pytest.mark.parametrize(
    ("scope", "body", "rollout"),
    [
        (_scope(headers={"X-Rollout-Id": "r7", "x-rollout-attempt": "2"}), b"", "r7"),
        (_scope("/r/r8/3/seed_session"), b"", "r8"),
        (_scope(f"/ng-rollout/{ng_path_id(Identity('r9', 4))}/run"), b"", "r9"),
        (_scope("/ng-rollout/plain/run"), b"", "plain"),
        (
            _scope(headers={"cookie": f"a=b; rollcut_session={session_cookie(Identity('r10', 1))}"}),
            b"",
            "r10",
        ),
        (_scope("/run"), json.dumps({"_ng_rollout_id": "r11", "_ng_attempt_index": 0}).encode(), "r11"),
        (_scope("/healthz"), b"", None),
        (_scope("/run"), b'{"_ng_rollout_id": ', None),  # not JSON: the owner's app refuses it
        (_scope(headers={"cookie": "rollcut_session=\x00;;"}), b"", None),
    ],
)
def test_the_rollout_a_request_names_wherever_it_says_it(
    scope: dict[str, Any], body: bytes, rollout: str | None
) -> None:
    assert routing_key(scope, body) == rollout


def test_owners_are_the_same_in_every_process_and_spread_over_the_workers() -> None:
    ids = [f"rollout-{i}" for i in range(3000)]
    here = [owner_of(r, 3) for r in ids]
    code = f"from rollcut.gym import owner_of; print([owner_of(r, 3) for r in {ids!r}])"
    # another interpreter (another hash seed) agrees: a restarted worker holds the same rollouts
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(there.stdout) == here
    spread = Counter(here)
    assert set(spread) == {0, 1, 2} and min(spread.values()) > 900


async def test_a_rollout_whose_worker_cannot_be_reached_is_a_503_in_the_error_shape(tmp_path: Path) -> None:
    app = gym_app("probe")

    @app.post("/echo")
    async def echo() -> dict[str, str]:
        return {"served_by": "worker 0"}

    app.state.peers = Peers(index=0, count=2, directory=str(tmp_path))  # worker 1's socket is not there
    mine = next(f"r{i}" for i in range(100) if owner_of(f"r{i}", 2) == 0)
    theirs = next(f"r{i}" for i in range(100) if owner_of(f"r{i}", 2) == 1)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        here = await client.post("/echo", headers={"x-rollout-id": mine, "x-rollout-attempt": "1"})
        there = await client.post("/echo", headers={"x-rollout-id": theirs, "x-rollout-attempt": "1"})
        nobody = await client.post("/echo")  # names no rollout: served where it arrived
    assert here.json() == nobody.json() == {"served_by": "worker 0"}
    assert there.status_code == 503 and there.headers["retry-after"] == "1"
    assert there.json()["error"]["code"] == "worker_unavailable"
