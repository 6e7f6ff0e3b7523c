"""What every answer route shares: how an answer is shaped, and a call whose tokens stream out while
its custody runs to the end (OpenAI's chat and Responses streams, Anthropic's Messages stream)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..wire import GymError, Identity
from ._openai import UpstreamError, upstream_error
from ._service import CallResult, ModelService
from ._shapes import Training

__all__ = ["Answer", "Tokens", "refusal", "sse"]


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event's data line (and the blank line that ends it)."""
    return f"data: {json.dumps(payload)}\n\n"


@dataclass(frozen=True)
class Answer:
    """How one request's answer is shaped: the served name it reports, and whether it carries the
    call's token arrays (read from the token store, so a call served from the log shows its own)."""

    model: str
    wants_training: bool
    service: ModelService

    async def training(self, result: CallResult) -> Training | None:
        if not self.wants_training:
            return None
        return Training.of(await self.service.training_record(result))


def refusal(exc: GymError | UpstreamError) -> GymError:
    """A call that failed once its stream had begun: the error event it ends with."""
    return upstream_error(exc) if isinstance(exc, UpstreamError) else exc


class Tokens:
    """A call running in the background, its tokens as they come; custody runs to the end."""

    def __init__(self, service: ModelService, ident: Identity, body: dict[str, Any]) -> None:
        self.queue: asyncio.Queue[tuple[int, str, float] | None] = asyncio.Queue()
        # how many tokens came: none for the same call answered again from what it produced, whose
        # text a stream then sends whole, before its end (every route's stream)
        self.came = 0
        self.task = asyncio.ensure_future(service.call(ident, body, on_token=self._on_token))
        self.task.add_done_callback(lambda _: self.queue.put_nowait(None))

    async def _on_token(self, tok: int, text: str, logprob: float) -> None:
        await self.queue.put((tok, text, logprob))

    async def started(self) -> None:
        """Wait for the first token or the end; a call refused before it ran raises here, so the
        refusal is an HTTP error answer, not an event inside a stream."""
        first = asyncio.ensure_future(self.queue.get())
        await asyncio.wait([first, self.task], return_when=asyncio.FIRST_COMPLETED)
        # no token came if the queue is empty, or holds only the end the task's callback put there
        # (that end often won the race to here, and the refusal then went out inside a stream)
        no_token = not first.done() or first.result() is None
        if self.task.done() and self.task.exception() is not None and no_token:
            first.cancel()
            exc = self.task.exception()
            assert exc is not None
            raise exc
        self._first = first

    async def __aiter__(self) -> AsyncIterator[tuple[int, str, float]]:
        tok = await self._first
        while tok is not None:
            self.came += 1
            yield tok
            tok = await self.queue.get()
