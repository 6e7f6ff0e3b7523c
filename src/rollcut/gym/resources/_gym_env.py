"""Gym-shaped environments: a NeMo Gym resources server's own models and tools, as a rollcut participant.

A NeMo Gym resources server declares pydantic request and response models,
one route per tool, a seed request, a verify request, and keeps its sessions
in a dict keyed by the session cookie. Ported here, it keeps its models, its
tool names and its answers; what changes is where its state lives:

- the session's state is a pydantic model (``State``), not an entry in a
  dict, so rollcut can log it, restore it at a cut, and run a tool on a draft
  that becomes the session only once its event is durable;
- each tool is a method ``(self, state, body: Request) -> Response`` marked
  ``@tool``; its route answers the response model itself, as the Gym server
  did (the session revision rides in the ``X-Rollcut-Revision`` header);
- ``start(seed_request) -> State`` replaces ``seed_session``'s dict insert;
  ``grade(state, verify_request) -> reward`` replaces ``verify``'s lookup.

Declared checkpoint mode: ``event_sourced`` with the full state in every
mutation event (``state_in_events``), so a restore is exact without a delta
codec. See ``docs/porting-a-gym-server.md``.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ValidationError

from ...participants import CheckpointMode
from ..wire import ErrorKind, GymError
from ._env import Environment, ToolResult

__all__ = ["GymEnvironment", "tool"]

F = TypeVar("F", bound=Callable[..., Any])


def tool(fn: F) -> F:
    """Mark a method ``(self, state[, body: RequestModel]) -> ResponseModel`` as a tool route."""
    fn.__rollcut_tool__ = True  # type: ignore[attr-defined]
    return fn


class _NoArguments(BaseModel):
    pass


class GymEnvironment(Environment):
    """Base of a ported NeMo Gym resources server (override ``State``, the request models, ``start``,
    ``grade`` and the ``@tool`` methods)."""

    mode: ClassVar[CheckpointMode] = "event_sourced"
    state_in_events: ClassVar[bool] = True
    bare_answers: ClassVar[bool] = True
    State: ClassVar[type[BaseModel]]
    SeedRequest: ClassVar[type[BaseModel]] = _NoArguments
    VerifyRequest: ClassVar[type[BaseModel]] = _NoArguments

    def start(self, body: Any) -> BaseModel:
        """The session's first state, from the seed request (NeMo Gym's ``seed_session``)."""
        raise NotImplementedError(f"{self.name} does not say how a session starts")

    def grade(self, state: Any, body: Any) -> float:
        """The reward of a finished session (NeMo Gym's ``verify``)."""
        raise NotImplementedError(f"{self.name} does not say how it grades")

    # --- what rollcut's resources service calls ---------------------------------------

    def _methods(self) -> dict[str, Callable[..., BaseModel]]:
        return {
            name: method
            for name, method in inspect.getmembers(self, inspect.ismethod)
            if getattr(method, "__rollcut_tool__", False)
        }

    @staticmethod
    def _request_model(method: Callable[..., Any]) -> type[BaseModel] | None:
        hints = typing.get_type_hints(method)
        body = hints.get("body")
        return body if isinstance(body, type) and issubclass(body, BaseModel) else None

    @staticmethod
    def _parse(model: type[BaseModel], args: dict[str, Any], what: str) -> BaseModel:
        try:
            return model.model_validate(args)
        except ValidationError as exc:
            raise GymError(ErrorKind.BAD_REQUEST, f"{what}: {exc}") from exc

    def tools(self) -> dict[str, Callable[[Any, dict[str, Any]], ToolResult]]:
        out: dict[str, Callable[[Any, dict[str, Any]], ToolResult]] = {}
        for name, method in self._methods().items():
            model = self._request_model(method)

            def run(
                state: Any, args: dict[str, Any], method: Any = method, model: Any = model, name: str = name
            ) -> ToolResult:
                answer = method(state, self._parse(model, args, name)) if model else method(state)
                return answer.model_dump(mode="json"), None

            out[name] = run
        return out

    def tool_schemas(self) -> list[dict[str, Any]]:
        schemas = []
        for name, method in self._methods().items():
            model = self._request_model(method) or _NoArguments
            params = model.model_json_schema()
            schemas.append(
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": inspect.getdoc(method) or name,
                        "parameters": {
                            "type": "object",
                            "properties": params.get("properties", {}),
                            "required": params.get("required", []),
                        },
                    },
                }
            )
        return schemas

    def seed(self, args: dict[str, Any]) -> Any:
        return self.start(self._parse(self.SeedRequest, args, "seed_session"))

    def verify(self, state: Any, args: dict[str, Any]) -> dict[str, Any]:
        reward = float(self.grade(state, self._parse(self.VerifyRequest, args, "verify")))
        return {"reward": reward}

    def export_state(self, state: Any) -> bytes:
        blob: bytes = state.model_dump_json().encode()
        return blob

    def import_state(self, blob: bytes, codec_version: int) -> Any:
        return self.State.model_validate_json(blob)

    def copy(self, state: Any) -> Any:
        return None if state is None else state.model_copy(deep=True)
