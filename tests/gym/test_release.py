"""A checkpoint releases every participant in one wave (issue 53): a caller that meets its server
still closed is in again milliseconds later, not a whole Retry-After later."""

from __future__ import annotations

import time
from collections.abc import Awaitable

import httpx

from rollcut.gym._attempts import admission_backoff, sent_when_admitted

from .conftest import ModelRig


def test_a_refused_caller_asks_again_after_5_ms_doubling_never_past_retry_after_or_a_second() -> None:
    assert [admission_backoff(t, 1.0) for t in range(9)] == [
        0.005,
        0.01,
        0.02,
        0.04,
        0.08,
        0.16,
        0.32,
        0.64,
        1.0,
    ]
    assert admission_backoff(3, 0.02) == 0.02  # the server said sooner
    assert admission_backoff(12, None) == 1.0


async def test_a_caller_released_before_its_server_is_in_at_its_next_try(rig: ModelRig) -> None:
    """The agent's resume came first: its call meets the model still closed (its own resume in
    flight), is refused, and the model reopens as the refusal comes back. The call goes through at
    the next try, 5 ms later; it used to wait the model's Retry-After, a second."""
    await rig.log.dispatch("r1", {}, instance="collector")
    rig.participant.gate.close("ck-release", until=time.time() + 10)
    slept: list[float] = []
    refusals = 0

    async def sleep(s: float) -> None:
        slept.append(s)

    def refused() -> None:
        nonlocal refusals
        refusals += 1
        rig.participant.gate.open()  # the model's resume lands

    def send() -> Awaitable[httpx.Response]:
        return rig.client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}]},
            headers=rig.headers("r1"),
        )

    resp = await sent_when_admitted(send, where="model", wait_s=30, on_wait=refused, sleep=sleep)
    assert resp.status_code == 200, resp.text
    assert (refusals, slept) == (1, [0.005])
