"""An opaque agent's declared normalisation, on requests Claude Code really sent: two runs of one
task differ only in what the rules name, so under them they are one request; and the rules hide
nothing else (another prompt, another working directory, a field they do not name still differ)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from rollcut import ConfigError
from rollcut.gym.opaque import Normalise, request_digest

from ..claude_code import CLAUDE_CODE_RULES

RECORDED = json.loads((Path(__file__).with_name("claude_code_requests.json")).read_text())["requests"]
ROUTE = "/v1/messages?beta=true"


def digest(body: dict[str, Any], rules: list[str]) -> str:
    return request_digest("POST", ROUTE, json.dumps(body).encode(), "application/json", Normalise(rules))


def _next_day(body: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(body).replace("2026-12-03", "2026-12-04"))


def test_two_runs_of_one_task_are_one_request_only_under_the_declared_rules() -> None:
    first, second = RECORDED
    assert first["metadata"] != second["metadata"]  # a device and a session id of each process
    assert digest(first, []) != digest(second, [])
    assert digest(first, CLAUDE_CODE_RULES) == digest(second, CLAUDE_CODE_RULES)
    # the next day: the date is in the system prompt and in the first user message
    tomorrow = _next_day(second)
    assert digest(first, ["metadata.user_id"]) != digest(tomorrow, ["metadata.user_id"])
    assert digest(first, CLAUDE_CODE_RULES) == digest(tomorrow, CLAUDE_CODE_RULES)


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b["messages"][0]["content"][-1].update(text="What is in todo.txt?"),  # another task
        lambda b: b["system"][-1].update(text=b["system"][-1]["text"].replace("/tmp/", "/var/tmp/")),  # cwd
        lambda b: b.update(max_tokens=b["max_tokens"] + 1),
        lambda b: b["metadata"].update(other="x"),  # a field of metadata the rules do not name
        lambda b: b.pop("metadata"),  # a request without the field is not one with it
    ],
)
def test_the_rules_hide_nothing_they_do_not_name(change: Any) -> None:
    first, second = RECORDED
    changed = copy.deepcopy(second)
    change(changed)
    assert digest(first, CLAUDE_CODE_RULES) != digest(changed, CLAUDE_CODE_RULES)


@pytest.mark.parametrize("rule", ["", "a..b", "a.b~", "a~(unclosed", "a b"])
def test_a_rule_that_does_not_parse_stops_the_server(rule: str) -> None:
    with pytest.raises(ConfigError, match="normalise rule"):
        Normalise([rule])


@pytest.mark.timeout(60)
def test_a_backtracking_rule_runs_in_linear_time_on_a_hostile_request() -> None:
    """Issue 49: ``(x+x+)+y`` on 28 characters froze the agent server for 14 s under a backtracking
    engine, and doubles with each character; on 64 it would not end. RE2 answers at once (this test
    fails by its timeout, not by a clock, if it does not)."""
    body = {"messages": [{"role": "user", "content": "x" * 64}, {"role": "user", "content": "xxy"}]}
    out = Normalise(["messages.*.content~(x+x+)+y"]).apply(body)
    assert [m["content"] for m in out["messages"]] == ["x" * 64, "<normalised>"]


def test_a_rule_outside_re2_is_refused_naming_why() -> None:
    with pytest.raises(ConfigError, match="RE2"):
        Normalise([r"a~(x)\1"])
