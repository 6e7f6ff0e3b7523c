"""Every bundled environment that continues passes the environment contract (``rollcut.testing``):
at every revision of random episodes, its export and its log's fold rebuild the live state."""

from __future__ import annotations

import random
from typing import Any

from rollcut.gym.resources import ENVIRONMENTS, Environment
from rollcut.testing import EnvironmentContract


class _Named(EnvironmentContract):
    name = ""

    def make_environment(self) -> Environment:
        env: Environment = ENVIRONMENTS[self.name]()
        return env


class TestCounter(_Named):
    name = "counter"


class TestBlackjack(_Named):
    name = "blackjack"


class TestWorkplace(_Named):
    name = "workplace"


class TestWorkplaceExported(_Named):
    name = "workplace_exported"


class TestStatefulCounter(_Named):
    """NeMo Gym's own counter, ported: its tools take pydantic bodies and declare no schemas, so its
    episodes are written out (what a port with such tools does)."""

    name = "stateful_counter"

    def episode(self, env: Environment, rng: random.Random) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
        calls: list[tuple[str, Any]] = [
            ("increment_counter", {"count": rng.randint(-5, 5)}) for _ in range(self.calls_per_episode)
        ]
        calls.insert(3, ("get_counter_value", {}))
        calls.insert(5, ("increment_counter", {}))  # refused, as its server refuses it: nothing changes
        return {"initial_count": rng.randint(0, 9)}, calls
