"""What it takes to run one Gym server, declared once.

Each field is one option: its type, its default and its help (``Annotated[T, flag(help)]``).
``rollcut serve KIND``'s flags are made from these fields (``rollcut.cli._flags``); a server
with several workers hands the same struct to each worker process as JSON
(``python -m rollcut.gym --spec ...``), and the process harness turns it back
into the command line with :func:`cli_argv`. So a new option is a new field
here, and nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, cast

import msgspec

from .._flag import flag, flag_name
from ._capability import Capability, DivergencePolicy

if TYPE_CHECKING:
    from ..bus import Component

__all__ = [
    "SERVE_ARGUMENT",
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

    url: Annotated[str, flag("NATS URL of the bus (a cluster's: comma-separated).", envvar="ROLLCUT_URL")]
    namespace: Annotated[str, flag("Event namespace.", envvar="ROLLCUT_NAMESPACE", short="-n")] = "default"
    credentials: Annotated[
        str | None, flag("Role credentials file for --url.", envvar="ROLLCUT_CREDENTIALS")
    ] = None
    replicas: Annotated[
        int,
        flag(
            "Copies of the stream when it is created (3 on a three-node cluster).",
            envvar="ROLLCUT_REPLICAS",
            min=1,
        ),
    ] = 1
    host: Annotated[str, flag("Listen address.")] = "127.0.0.1"
    port: Annotated[int, flag("Listen port; 0 picks a free one (printed as LISTENING <url>).")] = 0
    fd: Annotated[
        int | None,
        flag(
            "Serve on this inherited listening TCP socket instead of binding --host/--port: whoever "
            "starts the server bound it and knows its address before it runs (as uvicorn's --fd).",
            min=0,
        ),
    ] = None
    name: Annotated[
        str,
        flag("Participant group name (default: the server kind; a resources server's env, an agent's kind)."),
    ] = ""
    workers: Annotated[int, flag("Worker processes, each its own participant.", min=1)] = 1
    max_body_bytes: Annotated[int, flag("Largest request body read; larger: 413.")] = 16 * 1024 * 1024

    @property
    def kind(self) -> Component:
        """The server kind, as in ``rollcut serve KIND``; also its component and bus role."""
        tag = msgspec.inspect.type_info(type(self))
        assert isinstance(tag, msgspec.inspect.StructType)
        return cast("Component", tag.tag)

    @property
    def group(self) -> str:
        """The participant group name: ``--name``, else the server kind."""
        return self.name or self.kind


class ModelServe(ServeOptions, kw_only=True, tag="model"):
    """The policy model server (``rollcut serve model``)."""

    tokens: Annotated[str, flag("Token store directory.")] = ".rollcut/tokens"
    backend: Annotated[str, flag("Generation backend.", names="BACKENDS")] = "local"
    upstream: Annotated[str, flag("openai and engine backends: the engine's base URL.")] = ""
    backend_options: Annotated[
        dict[str, str],
        flag(
            "An option of the backend, KEY=VALUE (repeatable): each backend declares its own, and one "
            "it does not take is refused naming those it does (docs/model-server.md).",
            flag="--backend-option",
        ),
    ] = {}
    """Read by the backend's own factory into its options struct (``rollcut.gym.model.BackendFactory``):
    a backend brings its options, and a name it does not know is refused naming the ones it does."""
    return_token_ids: Annotated[
        bool, flag("Put prompt/generation token ids and log-probs on every model output.")
    ] = False
    policy_version: Annotated[int, flag("The policy version generating (an integer that grows).")] = 0
    policy_version_file: Annotated[
        str, flag('A file holding the version (N or {"version": N}), rewritten by the trainer.')
    ] = ""
    max_policy_lag: Annotated[
        int | None, flag("A continued attempt whose kept tokens are more versions old than this starts over.")
    ] = None
    served_model_name: Annotated[
        list[str],
        flag(
            "A model name requests may ask for (as vLLM's --served-model-name: repeatable; the first answers "
            "requests naming none; "
            "default rollcut-local). Any other name is a 404 model_not_found."
        ),
    ] = []


class ResourcesServe(ServeOptions, kw_only=True, tag="resources"):
    """A resources (tool) server (``rollcut serve resources ENV``)."""

    env: Annotated[str, flag("The environment.", names="ENVIRONMENTS")] = ""
    unisolated: Annotated[
        bool, flag("sandbox: run commands without bubblewrap (they can read and write what this user can).")
    ] = False
    server: Annotated[str, flag("nemo-gym: the NeMo Gym resources server (`rollcut nemo-gym list`).")] = ""
    upstream: Annotated[
        str, flag("nemo-gym: front this running server instead of starting it from the installed wheel.")
    ] = ""
    replayable: Annotated[
        bool, flag("nemo-gym: declare the server replayable for this run (answers follow from calls).")
    ] = False
    upstream_timeout: Annotated[
        float, flag("nemo-gym: seconds to wait for the server's answer to one call (then a 504, named).")
    ] = 120.0
    normalise: Annotated[
        list[str],
        flag(
            "nemo-gym: a field of the server's answers that changes per process (an id, a timestamp), "
            "PATH or PATH~REGEX as an opaque agent's; left out when a replayed answer is compared "
            "(repeatable, none by default)."
        ),
    ] = []

    @property
    def group(self) -> str:
        """Resources servers are grouped by their environment."""
        return self.name or self.server or self.env


class AgentServe(ServeOptions, kw_only=True, tag="agent"):
    """An agent server (``rollcut serve agent simple`` or ``rollcut serve agent opaque``).

    ``command``, ``capability`` and ``on_divergence`` are the opaque agent's: the program it runs per
    attempt, what its runtime guarantees (``replayable_egress``, ``sandbox_snapshot``,
    ``restart_only``, the default), what a replay's divergent request leads to, the longest one
    run of the program may take (``run_timeout`` seconds; 0: no limit), and the provider that
    snapshots its sandbox (``sandbox``, ``NAME[:ARG]`` in :data:`rollcut.gym.SANDBOXES`).
    ``agent``, ``backend`` and ``engine_dialect`` name registry entries (open to plugins), checked
    when the server starts; the closed sets are typed, and msgspec refuses anything else on decode."""

    agent: Annotated[
        str, flag("Agent kind (opaque: a program of its own behind the relay).", names="AGENTS")
    ] = "simple"
    server: Annotated[str, flag("nemo-gym: NeMo Gym's agent (`rollcut nemo-gym list`).")] = ""
    model: Annotated[str, flag("Policy model server base URL.", required=True)] = ""
    resources: Annotated[
        dict[str, str], flag("ENV=URL of a resources server (repeatable).", required=True)
    ] = {}
    command: Annotated[
        str, flag("opaque: the program one attempt runs (task on stdin, answer on stdout).")
    ] = ""
    capability: Annotated[
        Capability,
        flag("opaque: replayable_egress, sandbox_snapshot or restart_only (default: restart_only)."),
    ] = Capability.RESTART_ONLY
    on_divergence: Annotated[
        DivergencePolicy, flag("opaque: fresh_dispatch, or go_live (stateless tools only).")
    ] = "fresh_dispatch"
    run_timeout: Annotated[
        float, flag("opaque: seconds one run of the program may take, then it is killed (0: none).")
    ] = 0.0
    sandbox: Annotated[
        str,
        flag(
            "opaque: the sandbox provider, NAME[:ARG], or DIR-TEMPLATE for the built-in tree "
            "(e.g. /var/tmp/agents/{rollout_id}).",
            names="SANDBOXES",
        ),
    ] = ""
    unisolated: Annotated[
        bool, flag("opaque: run the program without its bubblewrap sandbox (it can read what this user can).")
    ] = False
    """Without bubblewrap (docs/security.md: the program can then read what the server's user can,
    and reach the bus). Refused to start without it where bubblewrap cannot run."""
    normalise: Annotated[
        list[str],
        flag(
            "opaque: a request field left out of the replay's comparison, PATH (dotted, * any) or "
            "PATH~REGEX (matches in its strings); repeatable, none by default (docs/opaque-agents.md)."
        ),
    ] = []

    @property
    def group(self) -> str:
        """Agent servers are grouped by their kind (``simple``, ``opaque``, a plugin's): two of
        different kinds in one namespace never share an instance name (and so never revoke each
        other's identity, issue 54)."""
        return self.name or self.agent


class EnvironmentServe(ServeOptions, kw_only=True, tag="environment"):
    """The environment server (``rollcut serve environment``)."""

    agent: Annotated[str, flag("Agent server base URL.", required=True)] = ""


ServeSpec = ModelServe | ResourcesServe | AgentServe | EnvironmentServe
"""The options of any Gym server, as one tagged union."""

SERVE_ARGUMENT: dict[type[ServeOptions], tuple[str, ...]] = {
    ResourcesServe: ("env", "server"),
    AgentServe: ("agent", "server"),
}
"""The fields each kind takes as its command line's arguments, not as flags (the first required)."""
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
    positional = SERVE_ARGUMENT.get(type(opts), ())
    out += [str(v) for v in (getattr(opts, name) for name in positional) if v]
    for field in msgspec.structs.fields(opts):
        if field.name in positional:
            continue
        value: Any = getattr(opts, field.name)
        flag = flag_name(field)
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
