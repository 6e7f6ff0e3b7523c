"""What a tool environment declares, and how its state crosses a checkpoint.

An environment names its tools, seeds a session, applies a tool to a session's
state, verifies a final answer, and declares a checkpoint mode:

- ``event_sourced``: state is a fold of its mutation events. Each mutation
  carries either a ``delta`` the environment can re-apply (``apply_delta``) or
  the full state (``state_in_events = True``, through the codec).
- ``exported``: mutations carry neither; the environment exports a versioned
  snapshot at prepare, drained under the session lock.
- ``stateless``: no state between calls; ``verify`` is replayable (same answer
  when re-run after a crash).
- ``restart_only``: the default for an environment that declares nothing. It
  never continues: its rollouts fail closed into fresh dispatch.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from ..._errors import ConfigError
from ...participants import CheckpointMode

__all__ = ["Environment", "ToolResult"]

ToolResult = tuple[Any, Any]  # (result shown to the agent, delta to log or None)
"""What a tool returns: the result shown to the agent, and the delta to log (or None)."""


class Environment:
    """Base class: override what your environment supports."""

    name: ClassVar[str] = "env"
    mode: ClassVar[CheckpointMode] = "restart_only"
    codec_version: ClassVar[int] = 1
    state_in_events: ClassVar[bool] = False  # log the full state with every mutation
    verification: ClassVar[str] = "replayable"  # replayable | wait
    bare_answers: ClassVar[bool] = False  # a tool route answers the tool's result alone (Gym-shaped servers)
    reverify: ClassVar[str | None] = None  # NeMo Gym's ReverifyMode; None: derived from `mode`
    implicit_sessions: ClassVar[bool] = False
    """A call with no session makes one (seeded with ``{}``), as a NeMo Gym server makes one for any
    first call's cookie: its Gymnasium servers have no ``/seed_session`` and start at ``/reset``."""
    whole_rows: ClassVar[bool] = False
    """Seed and verify take NeMo Gym's rows whole (a NeMo Gym server behind rollcut reads its own
    fields from them), and the verify answer is the environment's own."""

    @classmethod
    def of(cls, opts: Any) -> Environment:
        """The environment a resources server with options ``opts`` (``ResourcesServe``) serves; an
        environment that needs more than its class (an upstream server) reads it from there."""
        return cls()

    @property
    def reverify_mode(self) -> str:
        """NeMo Gym's ``GET /reverify_mode``: ``stateless`` when verification reads only the finished
        row (a stateless environment), else ``unsupported`` (it reads the session, which is gone
        once the episode ends); an environment may declare its own (``unknown`` among them)."""
        return self.reverify or ("stateless" if self.mode == "stateless" else "unsupported")

    def tools(self) -> dict[str, Callable[[Any, dict[str, Any]], ToolResult]]:
        """Tool name -> fn(state, arguments) -> (result, delta). May mutate state in place."""
        return {}

    def parameters(self) -> dict[str, dict[str, Any]]:
        """Tool name -> JSON-schema properties of its arguments (for the model's tool list). Every one
        is required, as OpenAI's strict function schemas have them: a model held to the schema by
        constrained decoding then always gives them (docs/engines.md)."""
        return {}

    def tool_schemas(self) -> list[dict[str, Any]]:
        props = self.parameters()
        return [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": f"{self.name}: {name}",
                    "parameters": {
                        "type": "object",
                        "properties": props.get(name, {}),
                        "required": list(props.get(name, {})),
                    },
                },
            }
            for name in self.tools()
        ]

    def seed(self, args: dict[str, Any]) -> Any:
        return None

    @classmethod
    def demo_task(cls, rng: random.Random) -> dict[str, Any]:
        """One generated task for the demo and the benchmarks: its ``prompt``, ``seed`` and
        ``verify`` arguments. An environment that offers none is refused for a generated task set."""
        raise ConfigError(f"no generated tasks for environment {cls.name!r}")

    def verify(self, state: Any, args: dict[str, Any]) -> dict[str, Any] | Awaitable[dict[str, Any]]:
        """The verdict (``reward``, ``passed``); a slow verifier (a judge) may be a coroutine."""
        return {"reward": 0.0, "passed": False}

    # --- the codec: how state crosses a checkpoint ------------------------------------

    def export_state(self, state: Any) -> bytes | Awaitable[bytes]:
        raise NotImplementedError(f"{self.name} cannot export its state")

    def import_state(self, blob: bytes, codec_version: int) -> Any:
        raise NotImplementedError(f"{self.name} cannot import state")

    def apply_delta(self, state: Any, tool: str, arguments: Any, delta: Any) -> Any:
        """The state after a logged mutation (a coroutine for an environment that replays the call)."""
        raise NotImplementedError(f"{self.name} does not fold deltas")

    def bind(self, log: Any) -> None:
        """The log of the service this environment serves (a sandbox stores its blobs beside it)."""
        return None

    def open(self, *, unisolated: bool = False) -> None:
        """Called once by the server before it serves: an environment that runs commands checks
        here that it can isolate them (and refuses to start otherwise, unless ``unisolated``)."""
        return None

    def copy(self, state: Any) -> Any:
        """A draft to run a tool on; committed only once its event is durable. Any hook here may
        be a coroutine (``seed``, ``copy``, a tool, ``export_state``, ``import_state``)."""
        if state is None:
            return None
        blob = self.export_state(state)
        assert isinstance(blob, bytes), "an environment whose export is a coroutine defines its own copy"
        return self.import_state(blob, self.codec_version)

    def close(self, state: Any) -> None:
        """Release a state no longer used: a session's at its end, a draft whose call failed, the
        state a committed call superseded."""
        return None
