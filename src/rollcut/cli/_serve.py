"""``rollcut serve``: the Gym servers as checkpoint participants.

Each command turns its flags into one options struct (:mod:`rollcut.gym`),
whose fields the flags are named after; worker processes get that struct as
JSON through the hidden ``serve worker`` command, so no option is declared
twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .._errors import RollcutError
from ._target import NsOpt, ReplicasOpt, app, fail, with_options

__all__ = ["serve_app"]

serve_app = typer.Typer(no_args_is_help=True, help="Run the Gym servers (policy model, …) as participants.")
app.add_typer(serve_app, name="serve")

BusUrl = Annotated[
    str | None,
    typer.Option("--url", envvar="ROLLCUT_URL", help="NATS URL of the bus (a cluster's: comma-separated)."),
]
Creds = Annotated[
    Path | None,
    typer.Option("--credentials", envvar="ROLLCUT_CREDENTIALS", help="Role credentials file for --url."),
]
Host = Annotated[str, typer.Option(help="Listen address.")]
Port = Annotated[int, typer.Option(help="Listen port; 0 picks a free one (printed as LISTENING <url>).")]
Name = Annotated[str, typer.Option(help="Participant group name (default: the server kind, or the env).")]
Workers = Annotated[int, typer.Option(help="Worker processes, each its own participant.")]
MaxBody = Annotated[int, typer.Option("--max-body-bytes", help="Largest request body read; larger: 413.")]
AgentUrl = Annotated[str, typer.Option(help="Agent server base URL.")]


def _common(given: dict[str, Any]) -> dict[str, Any]:
    """The fields of :class:`rollcut.gym.ServeOptions` from the shared flags."""
    return {
        **given,
        "url": given["url"] or "",
        "credentials": str(given["credentials"]) if given["credentials"] else None,
    }


served = with_options(
    {
        "url": (BusUrl, None),
        "namespace": (NsOpt, "default"),
        "credentials": (Creds, None),
        "replicas": (ReplicasOpt, 1),
        "host": (Host, "127.0.0.1"),
        "port": (Port, 0),
        "name": (Name, ""),
        "workers": (Workers, 1),
        "max_body_bytes": (MaxBody, 16 * 1024 * 1024),
    },
    _common,
    "common",
)


def _names(registry: str) -> str:
    """What a registry has installed, for a command's help (lists names; imports nothing)."""
    from .. import _registries

    return ", ".join(getattr(_registries, registry).names()) or "none installed"


def _pairs(resources: list[str]) -> dict[str, str]:
    """``--resources ENV=URL`` (repeated) as a mapping; refused naming what is not a pair."""
    bad = [r for r in resources if "=" not in r]
    if bad:
        raise fail(f"--resources takes ENV=URL, got {', '.join(bad)}")
    return dict(r.split("=", 1) for r in resources)


def _serve(kind: str, flags: dict[str, Any], **fields: Any) -> None:
    """Build the options struct of server ``kind`` from a command's flags (named like its fields:
    the command passes its ``locals()``; ``common`` spreads, paths become strings) and ``fields``
    that override them, and serve it (the Gym package loads only here)."""
    from .. import gym

    given = {k: str(v) if isinstance(v, Path) else v for k, v in flags.items() if k != "common"}
    fields = {**flags["common"], **given, **fields}

    spec = {"model": gym.ModelServe, "resources": gym.ResourcesServe, "agent": gym.AgentServe}
    try:
        gym.serve(spec.get(kind, gym.EnvironmentServe)(**fields))
    except RollcutError as exc:
        raise fail(str(exc)) from exc


@serve_app.command("model")
@served
def serve_model(
    common: dict[str, Any],
    tokens: Annotated[Path, typer.Option("--tokens", help="Token store directory.")] = Path(
        ".rollcut/tokens"
    ),
    backend: Annotated[str, typer.Option(help=f"Generation backend: {_names('BACKENDS')}.")] = "local",
    upstream: Annotated[str, typer.Option(help="openai and engine backends: the engine's base URL.")] = "",
    engine_dialect: Annotated[
        str, typer.Option("--engine-dialect", help=f"engine backend: {_names('DIALECTS')}.")
    ] = "llama.cpp",
    engine_model: Annotated[str, typer.Option("--engine-model", help="engine backend: the model name.")] = "",
    engine_no_cuts: Annotated[
        bool,
        typer.Option("--engine-no-cuts", help="engine backend: running calls are excluded at a checkpoint."),
    ] = False,
    engine_handover: Annotated[
        float,
        typer.Option(
            "--engine-handover",
            help="engine backend: seconds a call waits for an engine that went away (a restart on new "
            "weights) before it fails; it then goes on from the tokens it has.",
        ),
    ] = 0.0,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="engine backend: a call's budget when it names none.")
    ] = 1024,
    seed: Annotated[int, typer.Option(help="Seed of the local backend.")] = 0,
    token_delay: Annotated[float, typer.Option("--token-delay", help="Seconds per generated token.")] = 0.0,
    tool_turns: Annotated[int, typer.Option("--tool-turns", help="Tool calls before a final answer.")] = 3,
    return_token_ids: Annotated[
        bool,
        typer.Option(
            "--return-token-ids", help="Put prompt/generation token ids and log-probs on every model output."
        ),
    ] = False,
    policy_version: Annotated[
        int, typer.Option("--policy-version", help="The policy version generating (an integer that grows).")
    ] = 0,
    policy_version_file: Annotated[
        str,
        typer.Option(
            "--policy-version-file",
            help='A file holding the version (N or {"version": N}), rewritten by the trainer.',
        ),
    ] = "",
    max_policy_lag: Annotated[
        int | None,
        typer.Option(
            "--max-policy-lag",
            help="A continued attempt whose kept tokens are more versions old than this starts over.",
        ),
    ] = None,
    served_model_name: Annotated[
        list[str] | None,
        typer.Option(
            "--served-model-name",
            help="A model name requests may ask for (repeatable; the first answers requests naming "
            "none; default rollcut-local). Any other name is a 404 model_not_found.",
        ),
    ] = None,
) -> None:
    """The OpenAI-compatible policy model server with durable call custody."""
    served_model_name = served_model_name or []
    _serve("model", locals())


@serve_app.command("resources")
@served
def serve_resources(
    env: Annotated[str, typer.Argument(help=f"The environment: {_names('ENVIRONMENTS')}.")],
    common: dict[str, Any],
    unisolated: Annotated[
        bool,
        typer.Option(
            "--unisolated",
            help="sandbox: run commands without bubblewrap (they can read and write what this user can).",
        ),
    ] = False,
) -> None:
    """A stateful resources (tool) server whose sessions restore exactly."""
    _serve("resources", locals())


@serve_app.command("agent")
@served
def serve_agent(
    agent: Annotated[
        str,
        typer.Argument(
            help=f"Agent kind: {_names('AGENTS')} (opaque: a program of its own behind the relay)."
        ),
    ],
    model: Annotated[str, typer.Option(help="Policy model server base URL.")],
    resources: Annotated[list[str], typer.Option(help="ENV=URL of a resources server (repeatable).")],
    common: dict[str, Any],
    command: Annotated[
        str, typer.Option(help="opaque: the program one attempt runs (task on stdin, answer on stdout).")
    ] = "",
    capability: Annotated[
        str,
        typer.Option(
            help="opaque: replayable_egress, sandbox_snapshot or restart_only (default: restart_only)."
        ),
    ] = "restart_only",
    on_divergence: Annotated[
        str, typer.Option(help="opaque: fresh_dispatch, or go_live (stateless tools only).")
    ] = "fresh_dispatch",
    run_timeout: Annotated[
        float,
        typer.Option(help="opaque: seconds one run of the program may take, then it is killed (0: none)."),
    ] = 0.0,
    sandbox: Annotated[
        str,
        typer.Option(
            help="opaque: the sandbox provider, NAME[:ARG], or DIR-TEMPLATE for the built-in tree "
            f"(e.g. /var/tmp/agents/{{rollout_id}}; installed: {_names('SANDBOXES')})."
        ),
    ] = "",
    unisolated: Annotated[
        bool,
        typer.Option(
            "--unisolated",
            help="opaque: run the program without its bubblewrap sandbox (it can read what this user can).",
        ),
    ] = False,
    normalise: Annotated[
        list[str] | None,
        typer.Option(
            "--normalise",
            help="opaque: a request field left out of the replay's comparison, PATH (dotted, * any) or "
            "PATH~REGEX (matches in its strings); repeatable, none by default (docs/opaque-agents.md).",
        ),
    ] = None,
) -> None:
    """An agent: the Simple Agent (boundaries, parking, continuation), or an opaque agent's program
    behind the journaling relay (docs/opaque-agents.md)."""
    normalise = normalise or []
    _serve("agent", locals(), resources=_pairs(resources))


@serve_app.command("environment")
@served
def serve_environment(agent: AgentUrl, common: dict[str, Any]) -> None:
    """The episode orchestrator: one /run per task, recording each episode's completion."""
    _serve("environment", locals())


@serve_app.command("worker", hidden=True)
def serve_one_worker(
    spec: Annotated[str, typer.Option(help="The server's options as JSON.")],
    worker_index: Annotated[int, typer.Option(help="This worker's index.")],
    listen_fd: Annotated[int, typer.Option(help="The listening socket inherited from the parent.")],
    peer_fd: Annotated[
        int | None, typer.Option(help="This worker's private socket, from the parent.")
    ] = None,
    peers_dir: Annotated[str, typer.Option(help="Where every worker's private socket is.")] = "",
    identity: Annotated[str, typer.Option(help="This worker's own bus identity, from the parent.")] = "",
) -> None:
    """One worker process of a server with several (started by the server itself)."""
    import msgspec

    from ..gym import decode_spec, run_worker, serve_worker

    opts = decode_spec(spec)
    if identity:  # the worker logs in as itself, never with the role's key
        opts = msgspec.structs.replace(opts, credentials=identity)
    run_worker(
        lambda sock, i, peers: serve_worker(opts, sock, i, peers),
        listen_fd,
        worker_index,
        opts.workers,
        peer_fd,
        peers_dir,
    )
