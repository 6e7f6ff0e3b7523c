"""What it takes to run one Gym server, declared once.

``rollcut serve KIND`` builds one of these from its command line; a server
with several workers hands the same struct to each worker process as JSON
(``rollcut serve worker --spec ...``), and the process harness turns it back
into the command line with :func:`cli_argv`. So a new option is a new field
here plus its CLI flag, and nothing else.
"""

from __future__ import annotations

from typing import Any, cast

import msgspec

from ..bus import Component
from ._capability import Capability, DivergencePolicy

__all__ = [
    "AgentServe",
    "EnvironmentServe",
    "ModelServe",
    "ResourcesServe",
    "ServeOptions",
    "ServeSpec",
    "cli_argv",
    "decode_spec",
    "encode_spec",
]


class ServeOptions(msgspec.Struct, kw_only=True, tag_field="kind"):
    """What every Gym server takes: the bus, its listening address, its group and workers."""

    url: str
    namespace: str = "default"
    credentials: str | None = None
    replicas: int = 1
    host: str = "127.0.0.1"
    port: int = 0
    name: str = ""
    workers: int = 1
    max_body_bytes: int = 16 * 1024 * 1024

    @property
    def kind(self) -> Component:
        """The server kind, as in ``rollcut serve KIND``; also its component and bus role."""
        tag = msgspec.inspect.type_info(type(self))
        assert isinstance(tag, msgspec.inspect.StructType)
        return cast(Component, tag.tag)

    @property
    def group(self) -> str:
        """The participant group name: ``--name``, else the server kind."""
        return self.name or self.kind


class ModelServe(ServeOptions, kw_only=True, tag="model"):
    """The policy model server (``rollcut serve model``)."""

    tokens: str = ".rollcut/tokens"
    backend: str = "local"
    upstream: str = ""
    engine_dialect: str = "llama.cpp"
    engine_model: str = ""
    engine_no_cuts: bool = False
    engine_handover: float = 0.0
    max_tokens: int = 1024
    seed: int = 0
    token_delay: float = 0.0
    tool_turns: int = 3
    return_token_ids: bool = False
    policy_version: int = 0
    policy_version_file: str = ""
    max_policy_lag: int | None = None
    served_model_name: list[str] = []
    """The model names requests may ask for (vLLM's ``--served-model-name``); empty: ``rollcut-local``.
    The first is what a request naming none is answered as; any other name is a 404."""


class ResourcesServe(ServeOptions, kw_only=True, tag="resources"):
    """A resources (tool) server (``rollcut serve resources ENV``)."""

    env: str = ""
    unisolated: bool = False  # an environment that runs commands (sandbox): without bubblewrap

    @property
    def group(self) -> str:
        """Resources servers are grouped by their environment."""
        return self.name or self.env


class AgentServe(ServeOptions, kw_only=True, tag="agent"):
    """An agent server (``rollcut serve agent simple`` or ``rollcut serve agent opaque``).

    ``command``, ``capability`` and ``on_divergence`` are the opaque agent's: the program it runs per
    attempt, what its runtime guarantees (``replayable_egress``, ``sandbox_snapshot``,
    ``restart_only``, the default), what a replay's divergent request leads to, the longest one
    run of the program may take (``run_timeout`` seconds; 0: no limit), and the provider that
    snapshots its sandbox (``sandbox``, ``NAME[:ARG]`` in :data:`rollcut.gym.SANDBOXES`).
    ``agent``, ``backend`` and ``engine_dialect`` name registry entries (open to plugins), checked
    when the server starts; the closed sets are typed, and msgspec refuses anything else on decode."""

    agent: str = "simple"
    model: str = ""
    resources: dict[str, str] = {}
    command: str = ""
    capability: Capability = Capability.RESTART_ONLY
    on_divergence: DivergencePolicy = "fresh_dispatch"
    run_timeout: float = 0.0
    sandbox: str = ""
    unisolated: bool = False
    """Run the opaque agent's program without its bubblewrap sandbox (docs/security.md: it can then
    read what the server's user can, and reach the bus). Refused to start without it where
    bubblewrap cannot run."""
    normalise: list[str] = []
    """The opaque agent's declared request fields left out of a replay's comparison (``PATH`` or
    ``PATH~REGEX``; :class:`rollcut.gym.opaque.Normalise`): none unless declared."""


class EnvironmentServe(ServeOptions, kw_only=True, tag="environment"):
    """The environment server (``rollcut serve environment``)."""

    agent: str = ""


ServeSpec = ModelServe | ResourcesServe | AgentServe | EnvironmentServe
"""The options of any Gym server, as one tagged union."""

_POSITIONAL = {ResourcesServe: "env", AgentServe: "agent"}
_decoder = msgspec.json.Decoder(ServeSpec)


def encode_spec(opts: ServeSpec) -> str:
    """The struct as one JSON argument for a worker process."""
    return msgspec.json.encode(opts).decode()


def decode_spec(spec: str) -> ServeSpec:
    """The struct a parent handed its worker."""
    return _decoder.decode(spec)


def cli_argv(opts: ServeSpec) -> list[str]:
    """``rollcut serve`` arguments that build exactly ``opts``: the kind, positionals, then flags."""
    out: list[str] = [opts.kind]
    positional = _POSITIONAL.get(type(opts))
    if positional is not None:
        out.append(str(getattr(opts, positional)))
    for field in msgspec.structs.fields(opts):
        if field.name == positional:
            continue
        value: Any = getattr(opts, field.name)
        flag = "--" + field.name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, dict):
            out += [a for k, v in value.items() for a in (flag, f"{k}={v}")]
        elif isinstance(value, list):
            out += [a for v in value for a in (flag, str(v))]
        elif isinstance(value, bool):
            out += [flag] if value else []
        else:
            out += [flag, str(value)]
    return out
