"""The backend contract: what a model backend that cuts generations must do.

At a checkpoint the model service takes a running call's tokens so far as its durable prefix; after
a crash the call is asked again and the backend continues from that prefix (``adopt_prefix``, then
``generate(start=k)``). Whatever the backend, the continued call must be the call it would have
been: the prefix's tokens and log-probs kept as they were, then the rest. With a deterministic
request (the local backend; an engine at temperature 0) the rest is the very tokens the
uninterrupted call generates, and that is what this suite checks, at several cut points.

Subclass :class:`BackendContract` in a test module (its name starting ``Test``) and implement
``make_backend`` (or override the ``backend`` fixture, for a backend that needs one of its own).
Needs pytest (loaded only when asked for).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from ..gym.model import Backend, Plan
from ..tokens import TokenRecord

__all__ = ["BackendContract"]


class BackendContract:
    """A cut at several points, continued: the uninterrupted call's tokens and log-probs."""

    body: ClassVar[dict[str, Any]] = {
        "messages": [{"role": "user", "content": "the agent and the tool, at length"}],
        "max_tokens": 48,
        "temperature": 0.0,
        "seed": 3,
    }
    cuts: ClassVar[tuple[int, ...]] = (1, 9, 30)

    def make_backend(self) -> Backend:
        """The backend under test (``can_cut``)."""
        raise NotImplementedError

    @pytest.fixture
    def backend(self) -> Iterator[Backend]:
        yield self.make_backend()

    def test_a_cut_and_its_continuation_are_the_uninterrupted_call(self, backend: Backend) -> None:
        assert backend.can_cut, f"the {backend.name} backend cannot cut: nothing to continue"
        asyncio.run(self._check(backend))

    async def _generated(
        self, backend: Backend, plan: Plan, *, start: int = 0, stop: int | None = None
    ) -> None:
        at = start
        async with contextlib.aclosing(backend.generate(plan, start=start)) as tokens:
            async for _ in tokens:
                at += 1
                if stop is not None and at >= stop:
                    break  # the cut: what generates past it stops when the stream closes

    async def _check(self, backend: Backend) -> None:
        whole = await backend.start(self.body)
        await self._generated(backend, whole)
        cuts = [k for k in self.cuts if k < len(whole.output_ids)]
        assert cuts, f"the uninterrupted call made {len(whole.output_ids)} tokens: no cut point inside"
        for k in cuts:
            first = await backend.start(self.body)
            await self._generated(backend, first, stop=k)
            prefix = TokenRecord(
                prompt_ids=list(first.prompt_ids),
                output_ids=list(first.output_ids[:k]),
                mask=[1] * k,
                logprobs=list(first.logprobs[:k]),
                policy_version=backend.policy_version,
            )
            again = await backend.start(self.body)
            assert await backend.adopt_prefix(again, prefix), f"the prefix cut at {k} was not adopted"
            await self._generated(backend, again, start=k)
            assert again.output_ids[:k] == prefix.output_ids, f"cut at {k}: the prefix changed"
            assert again.logprobs[:k] == prefix.logprobs, f"cut at {k}: the prefix's log-probs changed"
            assert again.output_ids == whole.output_ids, f"cut at {k}: not the uninterrupted tokens"
            assert again.finish_reason == whole.finish_reason
