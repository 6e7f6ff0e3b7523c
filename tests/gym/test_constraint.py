"""Structured outputs' constraint: a JSON schema as an automaton, and the grammar of what may follow
any prefix of an output (what a cut generation is continued under). The engine suite runs the
grammars on llama.cpp itself (tests/e2e/test_gemma.py)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollcut.gym.model._requests import check_chat, check_responses
from rollcut.gym.model._shapes import responses_input_to_chat
from rollcut.gym.model.engine._constraint import constraint_of, tool_call_of
from rollcut.gym.wire import GymError

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    },
}
READ = {"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {}}}}
NOTE = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 12}, "stars": {"type": "integer"}},
    "required": ["title", "stars"],
    "additionalProperties": False,
}


def _rules(grammar: str) -> dict[str, str]:
    return dict(line.split(" ::= ", 1) for line in grammar.splitlines())


def test_a_required_tool_choice_accepts_exactly_the_declared_calls() -> None:
    c = constraint_of({"tools": [ADD, READ], "tool_choice": "required"})
    assert c is not None and c.kind == "tool_call"
    assert c.complete('{"name":"add","arguments":{"n":-12}}')
    assert c.complete('{ "name": "read", "arguments": {}}')
    assert not c.complete('{"name":"add","arguments":{}}')  # n is required
    assert not c.complete('{"name":"sub","arguments":{"n":1}}')  # not a declared tool
    assert not c.complete('{"name":"add","arguments":{"n":1}} ')  # nothing after the value
    assert c.state_after('{"name":"mul') is None


def test_a_named_tool_choice_allows_that_tool_only() -> None:
    c = constraint_of(
        {"tools": [ADD, READ], "tool_choice": {"type": "function", "function": {"name": "read"}}}
    )
    assert c is not None
    assert c.complete('{"name":"read","arguments":{}}')
    assert not c.complete('{"name":"add","arguments":{"n":1}}')


@pytest.mark.parametrize(
    "body",
    [
        {"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tools": [], "tool_choice": "required"},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        {"response_format": {"type": "yaml"}},
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": ["café"]}}}},
    ],
)
def test_a_constraint_that_cannot_be_enforced_is_a_400(body: dict[str, Any]) -> None:
    with pytest.raises(GymError) as err:
        constraint_of(body)
    assert err.value.status == 400


def test_the_output_is_ascii_json_with_every_character_reachable_by_escape() -> None:
    c = constraint_of({"response_format": {"type": "json_schema", "json_schema": {"schema": NOTE}}})
    assert c is not None
    text = json.dumps({"title": "café ☕", "stars": 2})  # json.dumps escapes: "caf\u00e9 \u2615"
    assert text.isascii() and c.complete(text)
    # no rule lets a character past U+007F through: every negated class excludes them
    for body in _rules(c.grammar()).values():
        for cls in re.findall(r"\[\^[^\]]*\]", body):
            assert cls.endswith("\\x80-\\U0010FFFF]")


def test_no_constraint_for_a_plain_or_auto_request() -> None:
    assert constraint_of({"tools": [ADD], "tool_choice": "auto"}) is None
    assert constraint_of({"messages": [], "response_format": {"type": "text"}}) is None


def test_the_grammar_after_a_prefix_is_the_rest_of_the_output() -> None:
    c = constraint_of({"response_format": {"type": "json_schema", "json_schema": {"schema": NOTE}}})
    assert c is not None
    whole = _rules(c.grammar())
    assert whole["root"] == "[\\x7B] s1"  # an output starts with "{"
    rest = c.grammar(after='{"title": "ab')
    # inside the string: another character, the closing quote or an escape, and nothing else
    classes = {alt.split()[0] for alt in _rules(rest)["root"].split(" | ")}
    assert "[\\x22]" in classes and "[\\x5C]" in classes
    (other,) = classes - {"[\\x22]", "[\\x5C]"}
    assert other.startswith("[^") and "\\x22" in other and "\\x5C" in other
    done = c.grammar(after='{"title":"ab","stars":3}')
    assert done.strip() == 'root ::= ""'  # a whole output: nothing may follow
    with pytest.raises(ValueError):
        c.grammar(after='{"stars": 3')  # the schema's order: title first


@settings(max_examples=60, deadline=None)
@given(
    title=st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12),
    stars=st.integers(),
)
def test_every_prefix_of_a_valid_output_has_a_rest_and_only_the_whole_one_is_complete(
    title: str, stars: int
) -> None:
    c = constraint_of({"response_format": {"type": "json_schema", "json_schema": {"schema": NOTE}}})
    assert c is not None
    text = json.dumps({"title": title, "stars": stars}, separators=(",", ":"))
    for i in range(len(text) + 1):
        assert c.state_after(text[:i]) is not None, text[:i]
        assert c.complete(text[:i]) == (i == len(text))
        rules = _rules(c.grammar(after=text[:i]))
        # every rule a right-linear alternation of character classes, each naming a defined rule
        for body in rules.values():
            for name in re.findall(r"\b(s\d+|root)\b", body):
                assert name in rules


def test_a_constrained_reply_becomes_one_tool_call_and_a_cut_short_one_does_not() -> None:
    call = tool_call_of('{"name": "add", "arguments": {"n": 3}}', "0")
    assert call is not None and call["function"] == {"name": "add", "arguments": '{"n": 3}'}
    assert call == tool_call_of('{"name": "add", "arguments": {"n": 3}}', "0")  # the same id on replay
    assert tool_call_of('{"name": "add", "argu', "0") is None


def test_responses_tool_choice_and_text_format_reach_the_chat_body() -> None:
    body = {
        "input": "hi",
        "tools": [{"type": "function", "name": "add", "parameters": ADD["function"]["parameters"]}],
        "tool_choice": {"type": "function", "name": "add"},
        "text": {"format": {"type": "json_schema", "name": "note", "schema": NOTE, "strict": True}},
    }
    check_responses(body)
    chat = responses_input_to_chat(body)
    check_chat(chat)
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "note", "schema": NOTE, "strict": True},
    }


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [], "tool_choice": "sometimes"},
        {"messages": [], "tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "read"}}},
        {"messages": [], "response_format": {"json_schema": {}}},
    ],
)
def test_a_malformed_choice_or_format_is_a_400_naming_it(body: dict[str, Any]) -> None:
    with pytest.raises(GymError) as err:
        check_chat(body)
    assert err.value.status == 400
