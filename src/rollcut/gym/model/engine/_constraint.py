"""Structured outputs on an engine: ``tool_choice`` and ``response_format`` by constrained decoding,
continued exactly after a cut.

A base model does not write well-formed tool calls by itself; RL trains such models, so the engine
is made to: a call whose ``tool_choice`` is ``"required"`` or names a function, or whose
``response_format`` is ``json_schema`` / ``json_object``, is generated under a grammar, and its
text is then a JSON value of that shape (``{"name": …, "arguments": {…}}`` for a tool call).

The grammar is not the engine's own JSON-schema conversion, because a generation cut must be
continued. A continuation asks the engine for the rest with the prompt plus the prefix as a
token-id prompt, and an engine applies a grammar from the first token it generates, not from the
prompt: the original grammar would demand a whole new value after the prefix. So the rest is
asked under the grammar of *what may follow the prefix*. That is easy for a regular language: the
JSON schema becomes a regular expression (``outlines-core``, the converter Outlines and vLLM use),
the expression a minimal automaton (``interegular``); the prefix's text is run through the
automaton, and the grammar for the rest is the automaton from the state it reached, written as
right-linear GBNF rules (one rule per state: ``sN ::= [chars] sM | …``). A prefix the automaton
refuses cannot have come from the constraint, and the call fails rather than continue it.

A constrained output is ASCII: a character past U+007F is written as JSON's ``\\uXXXX`` escape
(the converter's strings gain that escape, the grammar excludes the rest), which JSON allows for any
character, so nothing is lost, and no generated token ends mid-character (llama.cpp's server merges
such tokens and drops their ids: docs/engines.md).

What that costs: recursive schemas are unrolled to a fixed depth by the converter, and an
unconstrained ``json_object`` compiles once per process in a few seconds (its automaton is about
200 states); ``minimum``/``maximum`` are not enforced by the converter (``maxLength``, ``enum``,
``const`` and array lengths are). Whitespace is at most one space between tokens, so a small model
cannot fill its budget with blanks.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

import interegular
from interegular.fsm import anything_else
from outlines_core.json_schema import build_regex_from_schema

from ...wire import ErrorKind, GymError

__all__ = ["Constraint", "constraint_of", "tool_call_of"]

_WHITESPACE = "[ ]?"
_LAST_CHAR = 0x10FFFF
_ESCAPES = r'\\["\\/bfnrt]'  # the converter's escapes inside a string ...
_ESCAPES_AND_UNICODE = r'\\(["\\/bfnrt]|u[0-9a-fA-F]{4})'  # ... and JSON's \uXXXX
_NON_ASCII = f"\\x80-\\U{_LAST_CHAR:08X}"

Kind = Literal["tool_call", "json"]


@dataclass(frozen=True)
class Constraint:
    """A call's output language: an automaton over characters, and the grammar of what may follow
    any prefix of it."""

    kind: Kind
    fsm: Any  # interegular's FSM (typed loosely there: its states and symbols are any hashables)
    live: frozenset[Any]  # states from which an accepting state is reachable

    def state_after(self, text: str) -> Any:
        """The automaton's state after ``text``; None if ``text`` cannot start an output."""
        state: Any = self.fsm.initial
        mapping: dict[Any, Any] = self.fsm.alphabet._symbol_mapping
        other = mapping.get(anything_else)
        for ch in text:
            symbol = mapping.get(ch, other)
            state = self.fsm.map.get(state, {}).get(symbol)
            if state is None or state not in self.live:
                return None
        return state

    def complete(self, text: str) -> bool:
        """Whether ``text`` is a whole output (an accepting state)."""
        return self.state_after(text) in self.fsm.finals

    def grammar(self, after: str = "") -> str:
        """GBNF for what may follow ``after`` (the text of a durable prefix; "" for a whole output)."""
        start = self.state_after(after)
        if start is None:
            raise ValueError("the prefix is not the start of an output of this constraint")
        return _gbnf(self.fsm, self.live, start)


def _live_states(fsm: Any) -> frozenset[Any]:
    back: dict[Any, set[Any]] = {}
    for src, moves in fsm.map.items():
        for dst in moves.values():
            back.setdefault(dst, set()).add(src)
    seen, todo = set(fsm.finals), list(fsm.finals)
    while todo:
        for src in back.get(todo.pop(), ()):
            if src not in seen:
                seen.add(src)
                todo.append(src)
    return frozenset(seen)


def _escape(code: int) -> str:
    return f"\\x{code:02X}" if code < 0x100 else f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"


def _ranges(codes: list[int]) -> str:
    out, i = [], 0
    while i < len(codes):
        j = i
        while j + 1 < len(codes) and codes[j + 1] == codes[j] + 1:
            j += 1
        out.append(_escape(codes[i]) if i == j else f"{_escape(codes[i])}-{_escape(codes[j])}")
        i = j + 1
    return "".join(out)


def _char_class(chars: set[str], others: bool, excluded: set[str]) -> str:
    """The characters that take one transition: ``chars`` listed, or, when the automaton's "any
    other character" takes it too, everything but ``excluded``."""
    if not others:
        return f"[{_ranges(sorted(ord(c) for c in chars))}]"
    return f"[^{_ranges(sorted(ord(c) for c in excluded))}{_NON_ASCII}]"


def _gbnf(fsm: Any, live: frozenset[Any], start: Any) -> str:
    """Right-linear rules, one per live state reachable from ``start``; a final state with no way
    on is left out (the alternative that reaches it just ends)."""
    by_symbol: dict[Any, set[str]] = {}
    mapping: dict[Any, Any] = fsm.alphabet._symbol_mapping
    for ch, symbol in mapping.items():
        if isinstance(ch, str):  # every character but "anything else"
            by_symbol.setdefault(symbol, set()).add(ch)
    other = mapping.get(anything_else)
    explicit = set().union(*by_symbol.values()) if by_symbol else set()

    def moves(state: Any) -> dict[Any, list[Any]]:
        targets: dict[Any, list[Any]] = {}
        for symbol, dst in fsm.map.get(state, {}).items():
            if dst in live:
                targets.setdefault(dst, []).append(symbol)
        return targets

    names: dict[Any, str] = {}
    order = [start]
    names[start] = "root"
    rules: list[str] = []
    i = 0
    while i < len(order):
        state = order[i]
        i += 1
        alts = []
        for dst, symbols in sorted(moves(state).items(), key=lambda kv: str(kv[0])):
            chars = set().union(*(by_symbol.get(s, set()) for s in symbols))
            takes_other = other in symbols
            cls = _char_class(chars, takes_other, explicit - chars)
            if moves(dst):
                if dst not in names:
                    names[dst] = f"s{len(names)}"
                    order.append(dst)
                alts.append(f"{cls} {names[dst]}")
            else:
                alts.append(cls)
        if not alts:
            rules.append(f'{names[state]} ::= ""')
        elif state in fsm.finals:
            rules.append(f"{names[state]} ::= ( {' | '.join(alts)} )?")
        else:
            rules.append(f"{names[state]} ::= {' | '.join(alts)}")
    return "\n".join(rules) + "\n"


@functools.lru_cache(maxsize=256)
def _compiled(kind: Kind, schema: str) -> Constraint:
    try:
        regex = build_regex_from_schema(schema, _WHITESPACE).replace(_ESCAPES, _ESCAPES_AND_UNICODE)
        if not regex.isascii():
            raise ValueError("a name or constant outside ASCII (the output is ASCII JSON)")
        fsm = interegular.parse_pattern(regex).to_fsm().reduce()  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, KeyError, NotImplementedError, RecursionError) as exc:
        raise GymError(ErrorKind.BAD_REQUEST, f"the schema cannot be enforced on the engine: {exc}") from exc
    return Constraint(kind, fsm, _live_states(fsm))


def _tools_by_name(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for t in body.get("tools") or []:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out[fn["name"]] = fn
    return out


def _arguments_schema(fn: dict[str, Any]) -> dict[str, Any]:
    params = fn.get("parameters")
    if not isinstance(params, dict) or not params.get("properties"):
        # no parameters: an empty object (a schema-less object would be any JSON object)
        return {"type": "object", "properties": {}, "additionalProperties": False}
    return params


def _call_schema(name: str, fn: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": _arguments_schema(fn)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def constraint_of(body: dict[str, Any]) -> Constraint | None:
    """The constraint a chat request asks for, or None; a request naming a tool it does not declare,
    or a schema the engine cannot enforce, is a 400."""
    choice = body.get("tool_choice")
    tools = _tools_by_name(body)
    if choice == "required" or isinstance(choice, dict):
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name") or choice.get("name")
            if name not in tools:
                raise GymError(
                    ErrorKind.BAD_REQUEST, f"tool_choice names {name!r}, which is not among the tools"
                )
            schema = _call_schema(name, tools[name])
        elif not tools:
            raise GymError(ErrorKind.BAD_REQUEST, "tool_choice is 'required' but no tools were given")
        else:
            schema = {"anyOf": [_call_schema(n, fn) for n, fn in sorted(tools.items())]}
        return _compiled("tool_call", json.dumps(schema))
    fmt = body.get("response_format")
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return _compiled("json", json.dumps({"type": "object"}))
    if fmt["type"] == "json_schema":
        spec = fmt.get("json_schema") or {}
        if not isinstance(spec.get("schema"), dict):
            raise GymError(ErrorKind.BAD_REQUEST, "response_format json_schema needs a `schema` object")
        return _compiled("json", json.dumps(spec["schema"]))
    raise GymError(ErrorKind.BAD_REQUEST, f"response_format type {fmt['type']!r} is not supported")


def tool_call_of(text: str, call_index: str) -> dict[str, Any] | None:
    """The OpenAI tool call a constrained reply's text spells, or None if it is not one (cut short
    by ``max_tokens``)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    digest = hashlib.blake2b(text.encode(), digest_size=6).hexdigest()
    return {
        "id": f"call_{call_index}_{digest}",
        "type": "function",
        "function": {"name": obj["name"], "arguments": json.dumps(obj.get("arguments") or {})},
    }
