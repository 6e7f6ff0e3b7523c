"""SGLang's native runtime API: ``POST /generate`` with ``input_ids``, as a cut needs it.

Facts from SGLang's public source (``python/sglang/srt/managers/io_struct.py``
``GenerateReqInput``, ``entrypoints/openai/protocol.py`` ``TokenizeRequest``,
``serving_tokenize.py``, and the tokenizer manager's output processor), read
2026-12-03:

- ``/generate`` takes ``input_ids`` (a token-id prompt), ``sampling_params``
  (``max_new_tokens``, ``temperature``, ``top_p``, ``stop``, ``sampling_seed``,
  the penalties, ``logit_bias``, and ``ebnf`` for a grammar), ``return_logprob``
  with ``logprob_start_len: -1`` (log-probs of the output only), ``stream`` and
  ``rid`` (the request's id, which ``/abort_request`` names);
- a streamed answer is ``data: {...}`` lines ending in ``data: [DONE]``, each
  ``{"text", "output_ids", "meta_info"}`` with ``meta_info.id`` (the rid),
  ``completion_tokens`` (the engine's own count), ``finish_reason`` (None, or
  ``{"type": "stop" | "length" | "abort", ...}``) and ``output_token_logprobs``
  (``[logprob, token_id, text]`` per token);
- by default each chunk is cumulative (every id and log-prob so far); with the
  server's ``--incremental-streaming-output`` only the new ones. Both are taken
  here: the new tokens of a chunk are its last ``completion_tokens - seen``;
- ``/tokenize`` applies the chat template to ``messages`` (and ``tools``) and
  answers ``{"tokens", "count", "max_model_len"}``; ``/detokenize`` takes
  ``tokens`` and answers ``{"text"}``;
- closing a streamed request's connection aborts it (the HTTP server aborts a
  request whose client went away), which is how every dialect here stops a
  generation at a cut; ``rid`` lets an operator abort one by hand.

``Capabilities``: a token prompt, streamed ids with log-probs, the engine's
count per chunk and a templating tokenizer: everything a cut needs. No slots:
SGLang's radix cache serves any request's prefix.
"""

from __future__ import annotations

import secrets
from typing import Any

import httpx

from ._dialects import Ask, Capabilities, EngineError, Piece, _chat, _ints, _Routes, _sampling

__all__ = ["SGLang"]

_RENAMED = {"seed": "sampling_seed"}  # OpenAI's name -> SGLang's sampling parameter


class SGLang(_Routes):
    """SGLang's runtime server (``python -m sglang.launch_server``): its native ``/generate``."""

    name = "sglang"
    capabilities = Capabilities(token_prompt=True, streamed_ids=True, counts_tokens=True, tokenize_route=True)
    no_slots = "SGLang has no slots: its radix cache serves any request"

    def __init__(self, model: str | None = None) -> None:
        super().__init__(model)  # /generate serves the one model loaded; /tokenize takes the name
        self._seen: dict[str, tuple[int, int]] = {}  # rid -> (ids, text chars) handed over so far

    async def tokenize(self, client: httpx.AsyncClient, body: dict[str, Any]) -> list[int]:
        return await self._tokens(client, _chat(body, **({"model": self.model} if self.model else {})))

    async def detokenize(self, client: httpx.AsyncClient, ids: list[int]) -> str:
        return await self._text(client, {"tokens": ids}, "text")

    def ask(self, ask: Ask) -> tuple[str, dict[str, Any]]:
        sampling: dict[str, Any] = {"max_new_tokens": ask.max_tokens, **_sampling(ask.body, _RENAMED)}
        if ask.logit_bias is not None:
            sampling["logit_bias"] = {str(k): float(v) for k, v in ask.logit_bias.items()}
        if ask.grammar is not None:
            sampling["ebnf"] = ask.grammar  # GBNF is the EBNF dialect SGLang's grammar backends take
        req = {
            "input_ids": ask.prompt,
            "sampling_params": sampling,
            "return_logprob": True,
            "logprob_start_len": -1,
            "stream": True,
            "rid": f"rollcut-{secrets.token_hex(8)}",
        }
        return "/generate", req

    def parse(self, chunk: dict[str, Any]) -> Piece:
        meta = chunk.get("meta_info")
        if not isinstance(meta, dict) or not isinstance(meta.get("id"), str):
            raise EngineError("a /generate chunk without meta_info.id", engine=self.name)
        rid, count = meta["id"], meta.get("completion_tokens")
        if isinstance(count, bool) or not isinstance(count, int):
            raise EngineError("a /generate chunk without meta_info.completion_tokens", engine=self.name)
        ids = _ints(chunk.get("output_ids") or [], "a chunk's output_ids", self.name)
        seen_ids, seen_chars = self._seen.get(rid, (0, 0))
        new = count - seen_ids
        if new < 0 or new > len(ids):
            raise EngineError(
                f"request {rid}: {count} tokens counted after {seen_ids}, {len(ids)} ids in the chunk",
                engine=self.name,
            )
        cumulative = len(ids) == count
        text = chunk.get("text")  # None on a cumulative chunk whose text the server left for later
        text = None if text is None else str(text)
        delta = "" if text is None else text[seen_chars:] if cumulative else text
        logprobs = [_logprob(e) for e in (meta.get("output_token_logprobs") or [])[-new:]] if new else []
        piece = Piece(ids=ids[len(ids) - new :], logprobs=logprobs, text=delta, engine_count=count)
        finish = meta.get("finish_reason")
        chars = seen_chars if text is None else len(text) if cumulative else seen_chars + len(text)
        self._seen[rid] = (count, chars)
        if finish is not None:
            self._seen.pop(rid, None)
            kind = finish.get("type") if isinstance(finish, dict) else finish
            if kind == "abort":
                why = finish.get("message", "") if isinstance(finish, dict) else ""
                raise EngineError(
                    f"request {rid} aborted by the engine {why}".rstrip(), engine=self.name, lost=True
                )
            piece.finish_reason = "length" if kind == "length" else "stop"
        return piece


def _logprob(entry: Any) -> float:
    """``[logprob, token_id, text]`` (or a bare number) as the log-prob."""
    value = entry[0] if isinstance(entry, list | tuple) and entry else entry
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EngineError(
            f"an output_token_logprobs entry that is not [logprob, id, text]: {entry!r}", engine="sglang"
        )
    return float(value)
