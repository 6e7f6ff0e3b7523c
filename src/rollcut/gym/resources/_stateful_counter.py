"""NeMo Gym's ``example_session_state_mgmt`` (the stateful counter), ported by the porting guide.

The Gym server keeps ``session_id -> count`` in a dict and has two tools,
``increment_counter({count}) -> {success}`` and ``get_counter_value() -> {count}``;
a session is seeded with ``initial_count``, and ``verify`` rewards 1.0 when
the count equals ``expected_count``. Same models, same routes, same answers
here; the count lives in the session's ``State``, which rollcut logs and
restores.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import BaseModel

from ._gym_env import GymEnvironment, tool

__all__ = [
    "CounterState",
    "GetCounterValueResponse",
    "IncrementCounterRequest",
    "IncrementCounterResponse",
    "StatefulCounter",
    "StatefulCounterSeedSessionRequest",
    "StatefulCounterVerifyRequest",
]


class IncrementCounterRequest(BaseModel):
    """``/increment_counter``'s body."""

    count: int


class IncrementCounterResponse(BaseModel):
    """``/increment_counter``'s answer."""

    success: bool


class GetCounterValueResponse(BaseModel):
    """``/get_counter_value``'s answer."""

    count: int


class StatefulCounterSeedSessionRequest(BaseModel):
    """``/seed_session``'s environment fields."""

    initial_count: int


class StatefulCounterVerifyRequest(BaseModel):
    """``/verify``'s environment fields."""

    expected_count: int


class CounterState(BaseModel):
    """One session: what the Gym server kept in its ``session_id -> count`` dict."""

    count: int = 0


class StatefulCounter(GymEnvironment):
    """The stateful counter on rollcut: its sessions survive a crash and restore at the cut."""

    name = "stateful_counter"
    State = CounterState
    SeedRequest = StatefulCounterSeedSessionRequest
    VerifyRequest = StatefulCounterVerifyRequest

    @classmethod
    def demo_task(cls, rng: random.Random) -> dict[str, Any]:
        start = rng.randint(0, 9)
        prompt = f"The counter starts at {start}; increment it, then read it."
        return {"prompt": prompt, "seed": {"initial_count": start}, "verify": {"expected_count": start + 3}}

    def start(self, body: StatefulCounterSeedSessionRequest) -> CounterState:
        return CounterState(count=body.initial_count)

    @tool
    def increment_counter(
        self, state: CounterState, body: IncrementCounterRequest
    ) -> IncrementCounterResponse:
        """Add ``count`` to the session's counter."""
        state.count += body.count
        return IncrementCounterResponse(success=True)

    @tool
    def get_counter_value(self, state: CounterState) -> GetCounterValueResponse:
        """The session's counter."""
        return GetCounterValueResponse(count=state.count)

    def grade(self, state: CounterState, body: StatefulCounterVerifyRequest) -> float:
        return float(body.expected_count == state.count)
