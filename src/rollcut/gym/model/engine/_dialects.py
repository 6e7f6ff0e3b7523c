"""How each inference engine is asked for tokens: its routes, parameter names and stream shape.

vLLM, SGLang and llama.cpp's server all speak OpenAI's API for text, but a generation cut needs
more than text: every generated token's id and log-prob as it streams, a prompt given as token
ids (so a continuation is the prompt plus the durable prefix, tokenized once, never re-tokenized
text), and the engine's own tokenizer and chat template (so the prompt ids in a row are the ones
the engine saw). Each engine names these differently; a dialect maps one request and one stream
chunk to rollcut's terms, and says what its engine can do (``Capabilities``), so that a call is
never cut where the engine cannot continue it exactly.

Facts per engine are from their public sources and, for llama.cpp, from running its server:
- llama.cpp (``llama-server``): ``POST /completion`` with ``prompt`` as token ids, ``n_predict``,
  ``n_probs``, ``return_tokens``, ``stream``; each chunk carries ``tokens``,
  ``completion_probabilities`` and ``tokens_predicted`` (the engine's own count, which shows when
  it merged tokens that end mid-character into one piece and dropped their ids);
  ``/apply-template``, ``/tokenize``, ``/detokenize``; ``grammar`` (GBNF) constrains a generation.
- vLLM: ``POST /v1/completions`` with a token-id ``prompt``, ``logprobs``,
  ``return_tokens_as_token_ids`` (tokens come back as ``"token_id:N"``), usage in the last chunk
  with ``stream_options.include_usage``; ``/tokenize`` takes chat ``messages`` with
  ``add_generation_prompt``; ``/detokenize``; ``structured_outputs.grammar`` constrains a generation
  (its structured-outputs page; ``guided_grammar`` until 0.12).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import httpx

from .._openai import CLIENT_ERRORS, UpstreamError

__all__ = ["STALE_RETRIES", "VLLM", "Ask", "Capabilities", "Dialect", "EngineError", "LlamaCpp", "Piece"]


class EngineError(UpstreamError):
    """The inference engine failed a call, or answered in a shape its dialect does not take."""

    def __init__(self, message: str, *, engine: str, status: int | None = None, lost: bool = False) -> None:
        super().__init__(f"{engine}: {message}", lost=lost, client_error=status in CLIENT_ERRORS)
        self.engine = engine
        self.status = status

    @classmethod
    def answered(cls, engine: str, path: str, status: int, text: str = "") -> EngineError:
        """An answer other than 200. A 503 is an engine that is up but still loading its weights (a
        restart on new ones): away, to be asked again, not wrong."""
        detail = f": {text[:300]}" if text else ""
        return cls(f"{path} answered {status}{detail}", engine=engine, status=status, lost=status == 503)


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do for custody; a cut needs all of the first three."""

    token_prompt: bool  # takes a prompt as token ids (a continuation is prompt + prefix, exactly)
    streamed_ids: bool  # streams each generated token's id and log-prob
    counts_tokens: bool  # says per chunk how many tokens it generated (a dropped id is seen at once)
    tokenize_route: bool  # tokenizes and templates chat messages itself
    slots: bool = False  # a request can be pinned to one of a fixed set of slots (and its prompt cache)

    @property
    def can_cut(self) -> bool:
        return self.token_prompt and self.streamed_ids


@dataclass
class Piece:
    """One stream chunk in rollcut's terms."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    engine_count: int | None = None  # tokens generated so far by this request, as the engine counts
    finish_reason: str | None = None  # "stop" | "length" once the request is over
    stop_sequence: str | None = None  # which of the request's stop strings ended it, if one did


class Dialect(Protocol):
    """One engine's routes, parameter names and chunk shape."""

    name: str
    capabilities: Capabilities

    async def tokenize(self, client: httpx.AsyncClient, body: dict[str, Any]) -> list[int]: ...

    async def detokenize(self, client: httpx.AsyncClient, ids: list[int]) -> str: ...

    def ask(self, ask: Ask) -> tuple[str, dict[str, Any]]:
        """The generation request (its route and body) for ``ask``: its ``grammar`` (GBNF)
        constrains what it may generate; its ``slot`` pins it to one of the engine's slots (with
        ``capabilities.slots``)."""
        ...

    async def slot_count(self, client: httpx.AsyncClient) -> int:
        """How many requests the engine runs at once, each in a slot of its own (with
        ``capabilities.slots``)."""
        ...

    def parse(self, chunk: dict[str, Any]) -> Piece: ...


STALE_RETRIES = 2
"""How often a request that met a kept-alive connection the engine had just closed is sent again.
llama.cpp's server closes a kept-alive connection after a few requests or seconds; the request was
never read, so sending it again on a new connection is safe (these routes only read)."""

STALE = (httpx.RemoteProtocolError, httpx.ReadError)
"""How a request that met a kept-alive connection the engine had closed fails before any answer:
closed (``RemoteProtocolError``: disconnected without a response) or reset (``ReadError``, as under
load: a plain collection on the engine lost one call in 500 to it)."""


async def _get(client: httpx.AsyncClient, engine: str, path: str) -> Any:
    try:
        resp = await client.get(path)
    except httpx.HTTPError as exc:
        raise EngineError(f"unreachable at {path}: {exc!r}", engine=engine, lost=True) from exc
    return _json(resp, engine, path)


async def _post(client: httpx.AsyncClient, engine: str, path: str, payload: dict[str, Any]) -> Any:
    for attempt in range(STALE_RETRIES + 1):
        try:
            resp = await client.post(path, json=payload)
            break
        except STALE as exc:  # a closed kept-alive connection, or the engine died
            if attempt == STALE_RETRIES:
                raise EngineError(f"unreachable at {path}: {exc!r}", engine=engine, lost=True) from exc
        except httpx.HTTPError as exc:
            raise EngineError(f"unreachable at {path}: {exc!r}", engine=engine, lost=True) from exc
    return _json(resp, engine, path)


def _json(resp: httpx.Response, engine: str, path: str) -> Any:
    """A 200 answer's JSON, or the error it is."""
    if resp.status_code != 200:
        raise EngineError.answered(engine, path, resp.status_code, resp.text)
    try:
        return resp.json()
    except ValueError as exc:
        raise EngineError(f"{path} answered with no JSON", engine=engine) from exc


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Chat messages as an engine's template takes them: text content parts joined, nulls as ''."""
    out = []
    for m in body.get("messages") or []:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
        out.append({**m, "content": content or ""})
    return out


def _ints(value: Any, what: str, engine: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise EngineError(f"{what} is not a list of token ids", engine=engine)
    return value


_SAMPLING = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "stop")


def _sampling(body: dict[str, Any], renamed: dict[str, str] | None = None) -> dict[str, Any]:
    """OpenAI's sampling parameters a request set, under the engine's names (``renamed``)."""
    names = renamed or {}
    return {names.get(k, k): body[k] for k in _SAMPLING if body.get(k) is not None}


def _chat(body: dict[str, Any], **more: Any) -> dict[str, Any]:
    """A request for an engine's chat-templating tokenizer: the messages, the tools if any, ``more``."""
    req: dict[str, Any] = {"messages": _messages(body), **more}
    if body.get("tools"):
        req["tools"] = [_tool(t) for t in body["tools"]]
    return req


def _tool(tool: Any) -> Any:
    """A tool as an engine's template takes it: a field given as null is left out (OpenAI's optional
    ``description``; llama.cpp refused a null one, "type must be string", as a 502)."""
    if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
        return tool
    return {**tool, "function": {k: v for k, v in tool["function"].items() if v is not None}}


@dataclass(frozen=True)
class Ask:
    """One generation request in rollcut's terms, before a dialect names its fields."""

    prompt: list[int]
    max_tokens: int
    body: dict[str, Any]
    grammar: str | None = None
    slot: int | None = None

    @property
    def logit_bias(self) -> dict[Any, Any] | None:
        """OpenAI's ``{"id": bias}``, where the request gave one; each engine spells it its own way."""
        bias = self.body.get("logit_bias")
        return bias if isinstance(bias, dict) else None


class _Routes:
    """What every dialect does alike: the tokenizer routes read, the request's terms gathered into
    an :class:`Ask` for the dialect's own ``ask``. ``no_slots`` says why an engine has none."""

    name: ClassVar[str]
    no_slots: ClassVar[str] = ""

    def __init__(self, model: str | None = None) -> None:
        self.model = model

    async def _tokens(self, client: httpx.AsyncClient, req: dict[str, Any]) -> list[int]:
        tok = await _post(client, self.name, "/tokenize", req)
        return _ints(tok.get("tokens"), "/tokenize's tokens", self.name)

    async def _text(self, client: httpx.AsyncClient, req: dict[str, Any], field: str) -> str:
        return str((await _post(client, self.name, "/detokenize", req)).get(field) or "")

    async def slot_count(self, client: httpx.AsyncClient) -> int:
        raise EngineError(self.no_slots, engine=self.name)

    def request(
        self,
        prompt: list[int],
        max_tokens: int,
        body: dict[str, Any],
        grammar: str | None = None,
        slot: int | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """:meth:`ask` with the request's terms one by one."""
        return self.ask(Ask(prompt, max_tokens, body, grammar, slot))

    def ask(self, ask: Ask) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError


class LlamaCpp(_Routes):
    """llama.cpp's own server (``llama-server``): its native ``/completion`` route."""

    name = "llama.cpp"
    capabilities = Capabilities(
        token_prompt=True, streamed_ids=True, counts_tokens=True, tokenize_route=True, slots=True
    )

    async def tokenize(self, client: httpx.AsyncClient, body: dict[str, Any]) -> list[int]:
        # llama-server serves the one model it loaded: the name is not sent
        prompt = (await _post(client, self.name, "/apply-template", _chat(body))).get("prompt")
        if not isinstance(prompt, str):
            raise EngineError("/apply-template gave no prompt", engine=self.name)
        return await self._tokens(client, {"content": prompt, "add_special": True, "parse_special": True})

    async def detokenize(self, client: httpx.AsyncClient, ids: list[int]) -> str:
        return await self._text(client, {"tokens": ids}, "content")

    async def slot_count(self, client: httpx.AsyncClient) -> int:
        total = (await _get(client, self.name, "/props")).get("total_slots")
        if isinstance(total, bool) or not isinstance(total, int) or total < 1:
            raise EngineError("/props gave no total_slots", engine=self.name)
        return total

    def ask(self, ask: Ask) -> tuple[str, dict[str, Any]]:
        req: dict[str, Any] = {
            "prompt": ask.prompt,
            "n_predict": ask.max_tokens,
            "stream": True,
            "n_probs": 1,  # the sampled token's log-prob (and the top one)
            "return_tokens": True,
            "cache_prompt": True,  # a continuation's prompt shares the original's cached prefix
        }
        req.update(_sampling(ask.body))
        if ask.logit_bias is not None:  # OpenAI's {"id": bias} as llama.cpp's pairs
            req["logit_bias"] = [[int(k), float(v)] for k, v in ask.logit_bias.items()]
        if ask.grammar is not None:
            req["grammar"] = ask.grammar
        if ask.slot is not None:  # the call's own slot: a continuation finds its prompt + prefix cached there
            req["id_slot"] = ask.slot
        return "/completion", req

    def parse(self, chunk: dict[str, Any]) -> Piece:
        ids = _ints(chunk.get("tokens") or [], "a chunk's tokens", self.name)
        probs = chunk.get("completion_probabilities") or []
        logprobs = [float(p["logprob"]) for p in probs if isinstance(p, dict) and "logprob" in p]
        count = chunk.get("tokens_predicted")
        finish = None
        if chunk.get("stop"):
            finish = "length" if chunk.get("stop_type") == "limit" else "stop"
        word = chunk.get("stopping_word")  # with stop_type "word": the stop string that matched
        return Piece(
            ids=ids,
            logprobs=logprobs,
            text=str(chunk.get("content") or ""),
            engine_count=count if isinstance(count, int) else None,
            finish_reason=finish,
            stop_sequence=word
            if chunk.get("stop_type") == "word" and isinstance(word, str) and word
            else None,
        )


class VLLM(_Routes):
    """vLLM's OpenAI-compatible server: ``/v1/completions`` with a token-id prompt."""

    name = "vllm"
    capabilities = Capabilities(
        token_prompt=True, streamed_ids=True, counts_tokens=False, tokenize_route=True
    )
    no_slots = "vLLM has no slots: its prefix cache serves any request"

    def _with_model(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"model": self.model, **payload} if self.model else payload

    async def tokenize(self, client: httpx.AsyncClient, body: dict[str, Any]) -> list[int]:
        return await self._tokens(client, self._with_model(_chat(body, add_generation_prompt=True)))

    async def detokenize(self, client: httpx.AsyncClient, ids: list[int]) -> str:
        return await self._text(client, self._with_model({"tokens": ids}), "prompt")

    def ask(self, ask: Ask) -> tuple[str, dict[str, Any]]:
        req: dict[str, Any] = {
            "prompt": ask.prompt,
            "max_tokens": ask.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
        }
        req.update(_sampling(ask.body))
        if ask.logit_bias is not None:
            req["logit_bias"] = ask.logit_bias
        if ask.grammar is not None:  # vLLM >= 0.12 (``guided_grammar`` before): GBNF through xgrammar
            req["structured_outputs"] = {"grammar": ask.grammar}
        return "/v1/completions", self._with_model(req)

    def parse(self, chunk: dict[str, Any]) -> Piece:
        piece = Piece()
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            piece.engine_count = usage["completion_tokens"]
        for choice in chunk.get("choices") or []:
            lp = choice.get("logprobs") or {}
            for tok in lp.get("tokens") or []:
                if not (isinstance(tok, str) and tok.startswith("token_id:")):
                    raise EngineError(
                        "tokens come back as text: start vLLM with --return-tokens-as-token-ids",
                        engine=self.name,
                    )
                piece.ids.append(int(tok.split(":", 1)[1]))
            piece.logprobs.extend(float(x) for x in lp.get("token_logprobs") or [])
            piece.text += str(choice.get("text") or "")
            if choice.get("finish_reason"):
                piece.finish_reason = "length" if choice["finish_reason"] == "length" else "stop"
                matched = choice.get("stop_reason")  # vLLM: the stop string (or token id) that matched
                if isinstance(matched, str) and matched:
                    piece.stop_sequence = matched
        return piece
