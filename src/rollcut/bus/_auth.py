"""Per-role credentials: who may publish what, enforced by the NATS server.

Roles and what each may publish (namespace ``ns``, prefix ``rc.ns``):

- admin: everything (operators and tools).
- coordinator: the coordinator lane ``mark.checkpoint``, fences (tombstone
  and open), ``ctl.>`` requests, ``$SRV.>`` pings, the stream's JetStream API.
- collector: fences (dispatch) and ``ev.*.*.collector`` (result hand-off).
- model, agent, resources, environment: only ``ev.*.*.<its component>`` and a
  marker lane of its own (never ``mark.checkpoint``), plus direct gets; they
  subscribe to ``ctl.*`` and ``$SRV.>`` and may answer requests.

A participant therefore cannot write another component's events, forge a
coordinator marker, or send control requests (so capabilities are answered
only to the coordinator and admin). Unauthenticated clients are refused at
connect. The same blocks work on an operator's cluster (docs/security.md).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import msgspec

from .._errors import ConfigError
from ._subjects import COORDINATOR_LANE, Subjects

__all__ = ["PARTICIPANT_ROLES", "ROLES", "Credentials", "load_credentials", "server_authorization"]

PARTICIPANT_ROLES = ("model", "agent", "resources", "environment")
ROLES = ("admin", "coordinator", "collector", *PARTICIPANT_ROLES)


class Credentials(msgspec.Struct, frozen=True, kw_only=True):
    """One password per role for one namespace; stored 0600 beside the server's data."""

    schema_version: int = 1
    namespace: str
    passwords: dict[str, str]

    @classmethod
    def generate(cls, namespace: str) -> Credentials:
        Subjects(namespace)  # validates the namespace
        return cls(namespace=namespace, passwords={r: secrets.token_urlsafe(24) for r in ROLES})

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(msgspec.json.encode(self))
        tmp.replace(path)

    def login(self, role: str) -> tuple[str, str]:
        if role not in self.passwords:
            raise ConfigError(f"no credentials for role {role!r}; roles: {', '.join(ROLES)}")
        return role, self.passwords[role]


def load_credentials(path: Path) -> Credentials:
    """Read role credentials written by ``rollcut nats`` (or the embedded server)."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=Credentials)
    except FileNotFoundError as exc:
        raise ConfigError(f"no credentials file at {path}") from exc
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"credentials file {path} is not valid: {exc}") from exc


def _permissions(role: str, s: Subjects) -> dict[str, object]:
    p = s.prefix
    js_read = [f"$JS.API.DIRECT.GET.{s.stream}", f"$JS.API.STREAM.INFO.{s.stream}"]
    inbox = ["_INBOX.>"]
    if role == "admin":
        return {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
    if role == "coordinator":
        return {
            "publish": {
                "allow": [
                    s.mark(COORDINATOR_LANE),
                    f"{p}.fence.*",
                    f"{p}.ctl.>",
                    "$SRV.>",
                    *js_read,
                    f"$JS.API.STREAM.CREATE.{s.stream}",
                    "$JS.API.INFO",
                ]
            },
            "subscribe": {"allow": inbox},
        }
    if role == "collector":
        return {
            "publish": {"allow": [f"{p}.fence.*", f"{p}.ev.*.*.collector", *js_read, "$JS.API.INFO"]},
            "subscribe": {"allow": inbox},
        }
    if role in PARTICIPANT_ROLES:
        return {
            "publish": {
                "allow": [f"{p}.ev.*.*.{role}", f"{p}.mark.*", *js_read, "$JS.API.INFO"],
                "deny": [s.mark(COORDINATOR_LANE)],
            },
            # the rollout lifecycle (retirements) and hand-offs: a participant drops what it holds
            "subscribe": {"allow": [*inbox, f"{p}.ctl.*", "$SRV.>", f"{p}.fence.*", f"{p}.ev.*.*.collector"]},
            "allow_responses": True,
        }
    raise ConfigError(f"unknown role {role!r}")


def server_authorization(creds: Credentials) -> str:
    """The ``authorization {}`` block for nats-server's config file."""
    s = Subjects(creds.namespace)
    users = [
        {"user": role, "password": creds.passwords[role], "permissions": _permissions(role, s)}
        for role in ROLES
    ]
    # nats-server's config format accepts JSON values
    return "authorization {\n  users = " + json.dumps(users, indent=2) + "\n}\n"
