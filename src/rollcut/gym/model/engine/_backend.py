"""The ``engine`` backend: a real inference engine generates, and its generations can be cut.

Every call streams from the engine; each received token's id and log-prob go into the call's
buffer (the plan) before the model service sees the token, so what the service holds is always
exactly what the engine sent. At a checkpoint's prepare, a running call is cut where its buffer
ends: the service makes those tokens the durable prefix, and the backend stops the engine's
request (closing the stream aborts it in vLLM, SGLang and llama.cpp's server) and at once asks
again for the rest, with the prompt plus the prefix as a token-id prompt and ``max_tokens``
reduced by the prefix. So after a cut the engine's state is the prefix, nothing the engine sent
past it is kept, and a continuation after a crash is the very request the call would have made
anyway. Tokens the engine sampled past the boundary before the abort reached it are discarded
(``engine_tokens_discarded``): the price of an exact boundary.

A call's prompt is tokenized by the engine itself, with the model's own chat template, never by
rollcut's byte-level stand-in, so prompt ids in the rows are the ones the engine saw.

An engine restarted under running calls (a trainer's weight update: llama.cpp's server has no
weight swap) is waited for, up to ``handover_s`` (``--backend-option handover=S``): a call that lost its
engine asks the new one for the rest, the prompt plus what it had, exactly as after a cut. Which
weights made which token is known by request, not by when a token was read: the policy clock is
read as a request is sent and again when its answer begins; if they differ the weights changed
while the request was on its way, its answer is discarded and the rest asked again. With the
trainer's order (stop the engine, then the new version, then start the engine on it) a request
whose two readings agree was answered by that version's weights.

Never a false prefix: a token is kept only with its id and log-prob; if the engine's count of
generated tokens disagrees with the ids it streamed (llama.cpp's server merges tokens that end
mid-character into one piece and drops their ids), the call fails, naming why, rather than keep
arrays that are not what was sampled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import msgspec

from ..._stats import ENGINE_STATS, tally
from .._backend import Plan
from .._requests import requested_limit
from ._constraint import Constraint, constraint_of, tool_call_of
from ._dialects import STALE, STALE_RETRIES, Ask, Dialect, EngineError, Piece
from ._pieces import Pieces

if TYPE_CHECKING:
    from ....tokens import TokenRecord
    from .._logprobs import TokenText

__all__ = ["EngineBackend"]

_MAX_LINE = 1 << 20  # one stream chunk; an engine sends a few hundred bytes per token
_decode = msgspec.json.Decoder().decode  # a chunk per token: the hot path of an engine call
_END = object()
_T = TypeVar("_T")
_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


@dataclass
class _Run:
    """One call's live state on the engine side."""

    body: dict[str, Any]
    limit: int
    constraint: Constraint | None = None  # tool_choice / response_format, enforced by a grammar
    slot: int | None = None  # the engine slot every request of this call goes to (llama.cpp)
    turn: int = 0  # bumped by a cut: whatever the current request still sends is not kept
    reader: asyncio.Task[None] | None = None
    texts: list[str] = field(default_factory=list)  # each kept token's text, as streamed


class EngineBackend:
    """An inference engine over HTTP, spoken to in its dialect; cuts where the engine can continue."""

    name = "engine"
    plans_ahead = True  # start() only tokenizes: it runs before admission and generates nothing

    def __init__(
        self,
        client: httpx.AsyncClient,
        dialect: Dialect,
        *,
        policy_version: str | None = None,
        default_max_tokens: int = 1024,
        cuts: bool = True,
        handover_s: float = 0.0,
    ) -> None:
        self.client = client
        self.dialect = dialect
        self.can_cut = cuts and dialect.capabilities.can_cut
        self.dispositions: tuple[str, ...] = (
            ("never_started", "completed", "prefix_cut", "failed", "excluded")
            if self.can_cut
            else ("never_started", "completed", "failed", "excluded")
        )
        self.policy_version = policy_version or f"engine:{dialect.name}"
        self.last_policy_version: str | None = None
        self.default_max_tokens = default_max_tokens
        self.handover_s = handover_s  # how long a call waits for an engine that went away
        self.stats = tally(ENGINE_STATS)
        # whether this backend is the engine's only client (one model-server worker): only then does it
        # pin calls to slots; K workers would each count every slot as theirs and queue behind each
        # other, so with several the engine places requests itself (its prompt-cache match)
        self.pin_slots = True
        self._free_slots: asyncio.Queue[int] | None = None
        self._slots_lock = asyncio.Lock()
        self._pieces = Pieces(lambda ids: self._reaching(lambda: self.dialect.detokenize(self.client, ids)))

    async def token_texts(self, ids: Sequence[int]) -> list[TokenText]:
        """Each id's text and bytes, from the engine's own detokenizer (see ``_pieces``)."""
        return await self._pieces.texts(ids)

    async def _take_slot(self) -> int | None:
        """A slot of the engine for one call, held until it ends: every request of the call (the
        first, and each asked anew after a cut) goes there, so the engine's prompt cache of that slot
        holds the prompt and the prefix and a continuation prefills only what is new. Without it an
        aborted request still holds its slot when the next arrives, the next lands in another slot,
        and a real model on a CPU prefills the whole prompt again at every checkpoint."""
        if not (self.pin_slots and self.dialect.capabilities.slots):
            return None
        if self._free_slots is None:
            async with self._slots_lock:
                if self._free_slots is None:
                    free = asyncio.Queue[int]()
                    count = await self._reaching(lambda: self.dialect.slot_count(self.client))
                    for slot in range(count):
                        free.put_nowait(slot)
                    self._free_slots = free
        return await self._free_slots.get()

    def _give_slot(self, slot: int | None) -> None:
        if slot is not None and self._free_slots is not None:
            self._free_slots.put_nowait(slot)

    def _limit(self, body: dict[str, Any]) -> int:
        limit = requested_limit(body)
        return self.default_max_tokens if limit is None else limit

    async def start(self, body: dict[str, Any]) -> Plan:
        constraint = constraint_of(body)  # a 400 before anything is asked of the engine
        prompt = await self._reaching(lambda: self.dialect.tokenize(self.client, body))
        return Plan(prompt, [], [], "stop", None, handle=_Run(body, self._limit(body), constraint))

    def streams_text(self, body: dict[str, Any]) -> bool:
        return not body.get("tools")  # a reply that may be a tool call is sent whole, parsed

    def piece(self, plan: Plan, index: int) -> str:
        run: _Run = plan.handle
        return run.texts[index] if index < len(run.texts) else ""

    async def adopt_prefix(self, plan: Plan, record: TokenRecord) -> bool:
        """Continue from a durable prefix only if it was generated for this very prompt."""
        if list(record.prompt_ids) != plan.prompt_ids or len(record.logprobs) != len(record.output_ids):
            return False
        plan.output_ids, plan.logprobs = list(record.output_ids), list(record.logprobs)
        run: _Run = plan.handle
        ids = plan.output_ids
        text = await self._reaching(lambda: self.dialect.detokenize(self.client, ids)) if ids else ""
        run.texts = [text] + [""] * (len(plan.output_ids) - 1) if plan.output_ids else []
        return True

    async def _reaching(self, ask: Callable[[], Awaitable[_T]]) -> _T:
        """``ask()``, asked again while the engine is away, up to ``handover_s``."""
        since: float | None = None
        while True:
            try:
                return await ask()
            except EngineError as exc:
                since = await self._wait_for_engine(exc, since)

    async def _wait_for_engine(self, exc: EngineError, since: float | None) -> float:
        """The engine went away (``exc``): wait a little before asking again, or give up with ``exc``
        once it has been away ``handover_s`` since ``since``. The waits grow with the time away (half
        of it, 50 ms to 1 s): a small model's engine is back in well under a second, a large one's
        in tens of seconds."""
        if not exc.lost or self.handover_s <= 0:
            raise exc
        now = asyncio.get_running_loop().time()
        since = now if since is None else since
        if now - since >= self.handover_s:
            raise exc
        await asyncio.sleep(min(max(0.05, (now - since) / 2), 1.0))
        return since

    def interrupt(self, plan: Plan) -> None:
        """A cut took the buffer as the prefix: stop the engine's request; the rest is asked anew."""
        run: _Run | None = plan.handle
        if run is None:
            return
        run.turn += 1
        if run.reader is not None and not run.reader.done():
            run.reader.cancel()
            self.stats.inc("engine_aborts")

    async def _read(self, prompt: list[int], n: int, run: _Run, out: asyncio.Queue[Any]) -> None:
        try:
            path, req = self.dialect.ask(Ask(prompt, n, run.body, self._grammar(run), run.slot))
        except EngineError as exc:
            out.put_nowait(exc)
            return
        self.stats.inc("engine_requests")
        try:
            async with self._opened(path, req) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread())[:300].decode("utf-8", "replace")
                    raise EngineError.answered(self.dialect.name, path, resp.status_code, text)
                async for line in resp.aiter_lines():
                    if len(line) > _MAX_LINE:
                        raise EngineError(f"a stream line over {_MAX_LINE} bytes", engine=self.dialect.name)
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        chunk = _decode(data)
                    except (ValueError, msgspec.DecodeError) as exc:
                        raise EngineError("a stream chunk is not JSON", engine=self.dialect.name) from exc
                    if isinstance(chunk, dict) and "error" in chunk:
                        raise EngineError(
                            f"error in stream: {str(chunk['error'])[:300]}", engine=self.dialect.name
                        )
                    out.put_nowait(self.dialect.parse(chunk) if isinstance(chunk, dict) else Piece())
            out.put_nowait(_END)
        except asyncio.CancelledError:
            out.put_nowait(_END)
            raise
        except httpx.HTTPError as exc:
            out.put_nowait(
                EngineError(f"lost the engine mid-call: {exc!r}", engine=self.dialect.name, lost=True)
            )
        except Exception as exc:  # the reader's failure is the call's: handed over, never lost
            out.put_nowait(exc)

    @contextlib.asynccontextmanager
    async def _opened(self, path: str, req: dict[str, Any]) -> AsyncIterator[httpx.Response]:
        """The generation request, its answer begun. Sent again only if it met a kept-alive
        connection the engine had closed (no answer at all: nothing was generated)."""
        for attempt in range(STALE_RETRIES + 1):
            try:
                stream = self.client.stream("POST", path, json=req)
                resp = await stream.__aenter__()
            except STALE:
                if attempt == STALE_RETRIES:
                    raise
                continue
            try:
                yield resp
            finally:
                await stream.__aexit__(None, None, None)
            return

    async def generate(self, plan: Plan, *, start: int = 0) -> AsyncGenerator[int, None]:
        """Stream the rest of the call from the engine, from ``plan.output_ids[:start]`` on."""
        run: _Run = plan.handle
        run.slot = await self._take_slot()
        try:
            async with contextlib.aclosing(self._generate(plan, run, start)) as tokens:
                async for tok in tokens:
                    yield tok
        finally:
            self._give_slot(run.slot)
            run.slot = None

    async def _generate(self, plan: Plan, run: _Run, start: int) -> AsyncGenerator[int, None]:
        del plan.output_ids[start:], plan.logprobs[start:], run.texts[start:]
        finished: str | None = None
        matched: str | None = None
        lost_since: float | None = None
        while finished is None:
            remaining = run.limit - len(plan.output_ids)
            if remaining <= 0:
                finished = "length"
                break
            turn, queue = run.turn, asyncio.Queue[Any]()
            asked = plan.clock() if plan.clock is not None else None
            run.reader = asyncio.ensure_future(
                self._read(plan.prompt_ids + plan.output_ids, remaining, run, queue)
            )
            received, ended, answered = 0, None, False
            try:
                while run.turn == turn:
                    item = await queue.get()
                    if item is _END:
                        break
                    if isinstance(item, Exception):
                        raise item
                    if not answered:
                        answered = True
                        if lost_since is not None:
                            self.stats.inc("engine_handovers")
                            lost_since = None
                        if asked is not None and plan.clock is not None and plan.clock() != asked:
                            self.stats.inc("engine_requests_straddled")
                            run.turn += 1  # whose answer this is cannot be known: asked again
                            break
                        if asked is not None and plan.opened is not None:
                            plan.opened(len(plan.output_ids), asked)
                    self._check(item, received)
                    received += len(item.ids)
                    for i, (tok, lp) in enumerate(zip(item.ids, item.logprobs, strict=True)):
                        if run.turn != turn:  # cut while the last token was being sent on
                            self.stats.inc("engine_tokens_discarded", len(item.ids) - i)
                            break
                        plan.output_ids.append(tok)
                        plan.logprobs.append(lp)
                        run.texts.append(item.text if i == 0 else "")
                        yield tok
                    ended = item.finish_reason or ended
                    matched = item.stop_sequence or matched
            except EngineError as exc:  # away (a restart on new weights): the rest from the one back
                lost_since = await self._wait_for_engine(exc, lost_since)
                continue
            finally:
                if run.reader is not None and not run.reader.done():
                    run.reader.cancel()
            if run.turn == turn:  # not cut: the request ran to its end
                if ended is None:
                    raise EngineError("the stream ended before the generation did", engine=self.dialect.name)
                finished = ended
        plan.finish_reason = finished
        plan.stop_sequence = matched if finished == "stop" else None
        # the text as the engine streamed it (an end token has no text; a detokenized one would say
        # "</s>"), after the prefix's text when the call continued one
        plan.text = "".join(run.texts)
        if run.constraint is None:
            if run.body.get("tool_choice") != "none":
                self._tool_calls(plan, run.body)
        elif run.constraint.kind == "tool_call" and plan.finish_reason == "stop":
            call = tool_call_of(plan.text, "0")
            if call is not None:
                plan.tool_calls, plan.text, plan.finish_reason = [call], None, "tool_calls"
                plan.stop_sequence = None

    def _grammar(self, run: _Run) -> str | None:
        """The constraint's grammar for what may follow the text kept so far (all of it at first;
        after a cut or a continued prefix, the rest)."""
        if run.constraint is None:
            return None
        kept = "".join(run.texts)
        try:
            return run.constraint.grammar(after=kept)
        except ValueError as exc:
            raise EngineError(
                f"the kept prefix {kept[:80]!r} is not the start of the output the call's "
                "tool_choice / response_format allows: it cannot be continued under it",
                engine=self.dialect.name,
            ) from exc

    def _check(self, piece: Piece, received: int) -> None:
        """Every kept token has its id and log-prob, as many as the engine says it generated."""
        lost = len(piece.ids) != len(piece.logprobs) or (
            piece.engine_count is not None and piece.engine_count != received + len(piece.ids)
        )
        if lost:
            raise EngineError(
                f"the engine generated {piece.engine_count} tokens but streamed "
                f"{received + len(piece.ids)} ids and {len(piece.logprobs)} log-probs in this chunk: "
                "it merged tokens that end mid-character and dropped their ids, so this call's arrays "
                "would not be what was sampled (see docs/engines.md)",
                engine=self.dialect.name,
            )

    @staticmethod
    def _tool_calls(plan: Plan, body: dict[str, Any]) -> None:
        """A reply naming a declared tool in ``<tool_call>{...}</tool_call>`` (the Hermes convention
        Qwen and Llama templates use) becomes OpenAI tool calls; anything else stays text."""
        names = {
            (t.get("function") or {}).get("name") for t in body.get("tools") or [] if isinstance(t, dict)
        }
        calls = []
        for n, m in enumerate(_TOOL_CALL.finditer(plan.text or "")):
            try:
                obj = json.loads(m.group(1))
            except ValueError:
                return
            if not isinstance(obj, dict) or obj.get("name") not in names:
                return
            calls.append(
                {
                    "id": f"call_{n}_{len(plan.output_ids)}",
                    "type": "function",
                    "function": {"name": obj["name"], "arguments": json.dumps(obj.get("arguments") or {})},
                }
            )
        if calls:
            plan.tool_calls, plan.text, plan.finish_reason = calls, None, "tool_calls"
