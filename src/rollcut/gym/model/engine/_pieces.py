"""Each token id's text, as the engine's own detokenizer has it (for log-probs).

An engine's detokenize route answers text, and a token that ends mid-character comes back as
U+FFFD (llama.cpp and vLLM both replace bytes that are not UTF-8). So a token's bytes are asked
of the engine one id at a time (the answer is a property of the id: kept, bounded by the
vocabulary), and a run of consecutive tokens none of which is text alone is asked as a whole:
when the run is whole text of exactly one byte per token, it is SentencePiece's byte fallback
(Gemma's and Llama's ``<0xE2>`` tokens) and each token is its byte. Anything else is reported as
the engine wrote it, with ``bytes`` null, as OpenAI's type allows: never a guessed split.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from .._logprobs import TokenText, of_bytes

__all__ = ["Pieces"]

_REPLACED = "\ufffd"
_MAX_KNOWN = 1 << 19  # more ids than any vocabulary served here (Gemma 3: 262,144)
_AT_ONCE = 8  # detokenize requests in flight for one answer


class Pieces:
    """An engine's token texts, learnt id by id and kept."""

    def __init__(self, detokenize: Callable[[list[int]], Awaitable[str]]) -> None:
        self._detokenize = detokenize
        self._known: dict[int, TokenText] = {}
        self._alone: dict[int, str] = {}  # ids whose text alone is not whole: what the engine wrote

    def _keep(self, tok: int, text: TokenText) -> None:
        if len(self._known) < _MAX_KNOWN:
            self._known[tok] = text

    async def _learn(self, ids: set[int]) -> None:
        gate = asyncio.Semaphore(_AT_ONCE)

        async def one(tok: int) -> tuple[int, str]:
            async with gate:
                return tok, await self._detokenize([tok])

        for tok, text in await asyncio.gather(*(one(t) for t in sorted(ids))):
            if _REPLACED in text:
                if len(self._alone) < _MAX_KNOWN:
                    self._alone[tok] = text
            else:
                self._keep(tok, of_bytes(text.encode("utf-8")))

    async def texts(self, ids: Sequence[int]) -> list[TokenText]:
        new = {t for t in ids if t not in self._known and t not in self._alone}
        if new:
            await self._learn(new)
        out: list[TokenText | None] = [self._known.get(t) for t in ids]
        i = 0
        while i < len(ids):
            if out[i] is not None:
                i += 1
                continue
            j = i
            while j < len(ids) and out[j] is None:
                j += 1
            run = list(ids[i:j])
            whole = await self._detokenize(run)
            raw = whole.encode("utf-8")
            if _REPLACED not in whole and len(raw) == len(run):  # byte fallback: a byte per token
                for k, b in zip(range(i, j), raw, strict=True):
                    out[k] = of_bytes(bytes([b]))
                    self._keep(ids[k], out[k])  # type: ignore[arg-type]
            else:
                for k in range(i, j):
                    out[k] = TokenText(self._alone.get(ids[k], _REPLACED), None)
            i = j
        return [t for t in out if t is not None]
