"""The ``local`` backend: deterministic generation with no weights and no network.

Why deterministic and planned: tests and the demo must be able to check that a
generation cut at any token and continued from its durable prefix produces
exactly the tokens an uninterrupted run would have. So each call first makes a
*plan*, a fixed token sequence derived from (seed, policy version, prompt,
tools); generation then emits the plan one token at a time, sleeping
``token_delay_s`` per token, or paced as a batched engine decodes (``gym._pace``),
so that a generation has a real duration a checkpoint can cut. Continuing from a
prefix checks the prefix against the plan and emits the rest.

The tokenizer is the byte-level stand-in (``_bytes``: token = byte + 3; 0-2 reserved).
Generated text is ASCII so any prefix decodes cleanly.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any

from .._pace import Pace, TokenTally
from ._backend import Plan
from ._bytes import OFFSET as _OFFSET
from ._bytes import decode, encode, render_prompt
from ._logprobs import TokenText, of_bytes
from ._requests import requested_limit

if TYPE_CHECKING:
    from ...tokens import TokenRecord

__all__ = ["LocalBackend"]
_WORDS = (
    "the", "result", "shows", "that", "we", "should", "check", "next", "value", "and", "then",
    "answer", "with", "care", "because", "each", "step", "counts", "so", "far", "looks", "good",
)  # fmt: skip


def _value_for(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A value that follows a JSON schema's type, enum, properties and items (what structured
    outputs ask; deeper than 8 levels, null)."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    if schema.get("type") == "object":
        props = schema.get("properties") or {}
        return {k: _value_for(v, rng, depth + 1) for k, v in sorted(props.items())}
    if schema.get("type") == "array":
        return [_value_for(schema.get("items") or {}, rng, depth + 1) for _ in range(rng.randint(1, 3))]
    return _arg_for(schema, rng)


def _structured(body: dict[str, Any], rng: random.Random) -> str | None:
    """The answer's text when ``response_format`` asks for JSON: an object following the schema."""
    fmt = body.get("response_format")
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema") or {}
        return json.dumps(_value_for(spec.get("schema") or {"type": "object"}, rng))
    if fmt.get("type") == "json_object":
        return json.dumps({"answer": rng.choice(_WORDS)})
    return None


def _arg_for(schema: dict[str, Any], rng: random.Random) -> Any:
    t = schema.get("type")
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    if t == "integer":
        return rng.randint(1, 9)
    if t == "number":
        return round(rng.uniform(0, 10), 2)
    if t == "boolean":
        return rng.random() < 0.5
    return rng.choice(_WORDS)


class LocalBackend:
    """Deterministic planner and token emitter."""

    name = "local"
    can_cut = True
    plans_ahead = True
    dispositions: tuple[str, ...] = ("never_started", "completed", "prefix_cut", "failed", "excluded")

    def __init__(
        self,
        *,
        seed: int = 0,
        token_delay_s: float = 0.0,
        tool_turns: int = 3,
        policy_version: str = "local-v1",
        pace: Pace | None = None,
        tally: TokenTally | None = None,
    ) -> None:
        self.seed = seed
        self.token_delay_s = token_delay_s
        self.pace, self.tally = pace, tally
        self.tool_turns = tool_turns
        self.policy_version = policy_version
        self.last_policy_version: str | None = None  # the local policy never changes mid-run

    def plan(self, body: dict[str, Any]) -> Plan:
        messages = body.get("messages") or []
        prompt = render_prompt(messages)
        prompt_ids = encode(prompt)
        tools = body.get("tools") or []
        tools_text = json.dumps(tools, sort_keys=True)
        material = f"{self.seed}|{self.policy_version}|{body.get('seed')}|{prompt}|{tools_text}"
        key = hashlib.blake2b(material.encode(), digest_size=16).digest()
        rng = random.Random(key)
        tool_results = sum(1 for m in messages if m.get("role") == "tool")
        tool_calls: list[dict[str, Any]] = []
        structured = _structured(body, rng)
        if structured is not None:
            text, finish = structured, "stop"
        elif tools and tool_results < self.tool_turns and body.get("tool_choice") != "none":
            fn = rng.choice(tools).get("function", {})
            props = (fn.get("parameters") or {}).get("properties") or {}
            args = {k: _value_for(v, rng) for k, v in sorted(props.items())}  # arrays and objects too
            call: dict[str, Any] = {
                "id": f"call_{key.hex()[:12]}",
                "type": "function",
                "function": {"name": fn.get("name", "tool"), "arguments": json.dumps(args, sort_keys=True)},
            }
            tool_calls = [call]
            shown = json.dumps({"name": call["function"]["name"], "arguments": args}, sort_keys=True)
            text = f"<tool_call>{shown}</tool_call>"
            finish = "tool_calls"
        else:
            words = [rng.choice(_WORDS) for _ in range(rng.randint(8, 40))]
            text = " ".join(words) + f". The answer is {rng.randint(0, 99)}."
            finish = "stop"
        matched: str | None = None  # the stop string found first in the text (the last one to cut)
        for stop in [body["stop"]] if isinstance(body.get("stop"), str) else body.get("stop") or []:
            at = text.find(stop) if stop else -1
            if at >= 0:
                text, tool_calls, finish, matched = text[:at], [], "stop", stop
        ids = encode(text)
        limit = requested_limit(body)
        if limit is not None and len(ids) > limit:
            ids, tool_calls, finish, matched = ids[:limit], [], "length", None
            text = decode(ids)
        logprobs = [
            -(
                (
                    int.from_bytes(hashlib.blake2b(key + i.to_bytes(4, "big"), digest_size=4).digest(), "big")
                    % 2000
                )
                / 1000
            )
            - 0.001
            for i in range(len(ids))
        ]
        return Plan(
            prompt_ids=prompt_ids,
            output_ids=ids,
            logprobs=logprobs,
            finish_reason=finish,
            text=None if tool_calls else text,
            tool_calls=tool_calls,
            stop_sequence=matched,
        )

    async def start(self, body: dict[str, Any]) -> Plan:
        return self.plan(body)

    async def generate(self, plan: Plan, *, start: int = 0) -> AsyncGenerator[int, None]:
        """Emit the plan's tokens from ``start``, one at a time."""
        for i in range(start, len(plan.output_ids)):
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)  # the time a real model would take
            if self.pace is not None:
                await self.pace.token()  # a step of the decode loop every call shares
            if self.tally is not None:
                self.tally.add()
            yield plan.output_ids[i]

    async def adopt_prefix(self, plan: Plan, record: TokenRecord) -> bool:
        """Whether a durable prefix belongs to this plan (so continuing it is sound)."""
        return plan.output_ids[: len(record.output_ids)] == list(record.output_ids)

    def streams_text(self, body: dict[str, Any]) -> bool:
        return not self.plan(body).tool_calls  # tool calls are sent whole at the end

    def piece(self, plan: Plan, index: int) -> str:
        return decode(plan.output_ids[index : index + 1])

    async def token_texts(self, ids: Sequence[int]) -> list[TokenText]:
        """A token is a byte (0-2 are reserved: no text)."""
        return [
            of_bytes(bytes([i - _OFFSET])) if _OFFSET <= i < _OFFSET + 256 else TokenText("", None)
            for i in ids
        ]

    def interrupt(self, plan: Plan) -> None:
        """Nothing to stop: the plan goes on from the frozen boundary by itself."""
