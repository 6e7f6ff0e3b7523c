"""Per-role credentials: who may publish what, enforced by the NATS server.

Roles and what each may publish (namespace ``ns``, prefix ``rc.ns``):

- admin: everything (operators and tools).
- coordinator: the coordinator lane ``mark.checkpoint``, fences (tombstone
  and open), ``ctl.>`` requests, ``$SRV.>`` pings, the stream's JetStream API;
  it hears announcements on ``hello.*``.
- collector: fences (dispatch) and ``ev.*.*.collector`` (result hand-off).
- model, agent, resources, environment: only ``ev.*.*.<its component>`` and a
  marker lane of its own (never ``mark.checkpoint``), its announcement
  ``hello.<its component>``, plus direct gets; they
  subscribe to their component's control subjects ``ctl.<component>.*`` (never
  another component's) and ``$SRV.>``, and may answer requests.

Authentication is NATS's own nkeys: each role has an ed25519 key pair; its seed
is in ``credentials.json`` (0600, in a 0700 directory) and the server's
config holds only public keys, so the config file gives nobody a secret.
(Credentials files of schema 1, with passwords, still load.)

A participant therefore cannot write another component's events, forge a
coordinator marker, or send control requests (so capabilities are answered
only to the coordinator and admin). Unauthenticated clients are refused at
connect. The same blocks work on an operator's cluster (docs/security.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import nkeys

from .._errors import ConfigError
from .._files import private_dir, read_record, write_private
from ._subjects import COLLECTOR_LANE, COORDINATOR_LANE, Subjects

__all__ = [
    "PARTICIPANT_ROLES",
    "ROLES",
    "Credentials",
    "load_credentials",
    "role_file",
    "server_authorization",
]

PARTICIPANT_ROLES = ("model", "agent", "resources", "environment")
ROLES = ("admin", "coordinator", "collector", *PARTICIPANT_ROLES)


class Credentials(msgspec.Struct, frozen=True, kw_only=True):
    """One nkey seed per role for one namespace (schema 1: passwords); stored 0600."""

    schema_version: int = 2
    namespace: str
    seeds: dict[str, str] = {}
    passwords: dict[str, str] = {}

    @classmethod
    def generate(cls, namespace: str) -> Credentials:
        """Fresh key pairs for every role."""
        Subjects(namespace)  # validates the namespace
        seeds = {r: nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode() for r in ROLES}
        return cls(namespace=namespace, seeds=seeds)

    def public_key(self, role: str) -> str:
        """The role's public nkey (what the server's config holds)."""
        return str(nkeys.from_seed(self.seeds[role].encode()).public_key.decode())

    def save(self, path: Path) -> None:
        """Write the seeds, readable by their owner only (0600 in a 0700 directory)."""
        private_dir(path.parent)
        write_private(path, msgspec.json.encode(self))

    def only(self, role: str) -> Credentials:
        """These credentials with one role's secret alone: what a server of that role is given."""
        self.login(role)  # refuses a role these do not hold
        return Credentials(
            namespace=self.namespace,
            seeds={role: self.seeds[role]} if role in self.seeds else {},
            passwords={role: self.passwords[role]} if role in self.passwords else {},
        )

    def login(self, role: str) -> dict[str, str]:
        """How ``role`` authenticates: ``{"nkey_seed"}``, or ``{"user", "password"}`` (schema 1)."""
        if role in self.seeds:
            return {"nkey_seed": self.seeds[role]}
        if role in self.passwords:
            return {"user": role, "password": self.passwords[role]}
        raise ConfigError(f"no credentials for role {role!r}; roles: {', '.join(ROLES)}")


def role_file(path: Path, role: str) -> Path:
    """A file beside ``path`` (``<name>.<role>.json``, 0600) holding ``role``'s secret only, written
    from the full credentials at ``path``: a server reads its own role's credentials and no other's,
    so nothing that reaches one server's files can act as another role (the admin seed is never
    on a server's command line or in its files)."""
    out = path.with_name(f"{path.stem}.{role}.json")
    write_private(out, msgspec.json.encode(load_credentials(path).only(role)))
    return out


def load_credentials(path: Path) -> Credentials:
    """Read role credentials written by ``rollcut nats`` (or the embedded server)."""
    return read_record(path, Credentials, "credentials file")


def _permissions(role: str, s: Subjects) -> dict[str, object]:
    p = s.prefix
    # direct gets (any replica), the leader's message get (read-your-writes on a cluster), stream info
    js_read = [
        f"$JS.API.DIRECT.GET.{s.stream}",
        f"$JS.API.STREAM.MSG.GET.{s.stream}",
        f"$JS.API.STREAM.INFO.{s.stream}",
    ]
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
                    f"$JS.API.STREAM.PURGE.{s.stream}",  # compaction
                    "$JS.API.INFO",
                ]
            },
            "subscribe": {"allow": [*inbox, s.hello("*")]},
        }
    if role == "collector":
        return {
            "publish": {
                "allow": [
                    f"{p}.fence.*",
                    f"{p}.ev.*.*.collector",
                    s.mark(COLLECTOR_LANE),
                    *js_read,
                    "$JS.API.INFO",
                ]
            },
            "subscribe": {"allow": inbox},
        }
    if role in PARTICIPANT_ROLES:
        return {
            "publish": {
                "allow": [f"{p}.ev.*.*.{role}", f"{p}.mark.*", s.hello(role), *js_read, "$JS.API.INFO"],
                "deny": [s.mark(COORDINATOR_LANE), s.mark(COLLECTOR_LANE)],
            },
            # the rollout lifecycle (retirements) and hand-offs: a participant drops what it holds
            "subscribe": {
                "allow": [*inbox, f"{p}.ctl.{role}.*", "$SRV.>", f"{p}.fence.*", f"{p}.ev.*.*.collector"]
            },
            "allow_responses": True,
        }
    raise ConfigError(f"unknown role {role!r}")


def server_authorization(creds: Credentials) -> str:
    """The ``authorization {}`` block for nats-server's config file."""
    s = Subjects(creds.namespace)
    users = [
        {"nkey": creds.public_key(role), "permissions": _permissions(role, s)}
        if role in creds.seeds
        else {"user": role, "password": creds.passwords[role], "permissions": _permissions(role, s)}
        for role in ROLES
    ]
    # nats-server's config format accepts JSON values
    return "authorization {\n  users = " + json.dumps(users, indent=2) + "\n}\n"
