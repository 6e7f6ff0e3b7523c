"""The shape of a task the agent runs, checked at the edge before anything is claimed or stored.

A malformed task must be a 400 in the API's error shape, and it must be refused before the run
claims its attempt: a claim is on the log for good, and a typo in a task must not use up an attempt.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from .wire import ErrorKind, GymError

__all__ = ["check_task"]

_Steps = Annotated[int, msgspec.Meta(ge=1, le=10_000)]
_Tokens = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]


class _Task(msgspec.Struct):
    """rollcut's own task row: which environment, the prompt, its seed and limits."""

    env: str
    prompt: str
    seed: dict[str, Any] = {}
    max_steps: _Steps = 8
    max_tokens: _Tokens = 256


class _ResponsesParams(msgspec.Struct):
    input: str | list[dict[str, Any]] = []
    tools: list[dict[str, Any]] | None = None


class _NemoRun(msgspec.Struct):
    """A NeMo Gym run row: ``responses_create_params`` plus the environment's own fields."""

    responses_create_params: _ResponsesParams
    max_steps: _Steps = 8


def check_task(task: dict[str, Any], environments: list[str]) -> None:
    """Refuse (400 ``bad_request``) a task this agent cannot run, naming the field and the rule."""
    try:
        if "responses_create_params" in task:
            msgspec.convert(task, _NemoRun)
            env = task.get("env")
            if env is None and len(environments) == 1:
                return
        else:
            env = msgspec.convert(task, _Task).env
    except msgspec.ValidationError as exc:
        raise GymError(ErrorKind.BAD_REQUEST, f"invalid task: {exc}") from exc
    if env not in environments:
        raise GymError(
            ErrorKind.BAD_REQUEST, f"name the environment (`env`) among {sorted(environments)}, got {env!r}"
        )
