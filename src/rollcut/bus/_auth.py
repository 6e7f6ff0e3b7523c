"""Credentials: one NATS identity per server instance, issued from its role's key.

Schema 3 (what ``Credentials.generate`` writes) is NATS's decentralised JWT mode. The
full file (``credentials.json``, 0600 in a 0700 directory, kept by whoever runs the
NATS servers) holds the operator's, the account's and the system account's seeds and
one **scoped signing key** per role; the servers' config holds only JWTs and public
keys. A server is given its role's file alone (``role_file``: that role's signing key,
nothing else). When an instance starts it makes its own identity: a fresh user key
and a user JWT named after the instance, signed with the role's key. The server
applies the role's scope template to it (``_scopes``), filling in the identity's name,
so what an instance may publish names its own lane, hello subject and control
subject only. A server with several workers issues each worker's identity itself
(``issue``) and hands it an identity-only file: a worker holds no key that makes
another identity. A replaced worker's old identity is revoked by the identity
authority (``rollcut.bus.authority``): the newest identity of a name is the only one
the server accepts.

Schema 2 (per-role nkey users in the server config) and schema 1 (passwords) still
load and still run, with one identity per role (docs/security.md).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

import msgspec
import nkeys

from .._errors import ConfigError
from .._files import private_dir, read_record, write_private
from ._jwt import encode_jwt, public_of
from ._renewal import DEFAULT_IDENTITY_TTL_S, PipeRenewal
from ._scopes import PARTICIPANT_ROLES, ROLES, jwt_permissions, permissions
from ._subjects import COLLECTOR_LANE, COORDINATOR_LANE, Subjects, check_token

__all__ = [
    "PARTICIPANT_ROLES",
    "ROLES",
    "Credentials",
    "Identity",
    "identity_from_pipe",
    "load_credentials",
    "role_file",
    "server_authorization",
]

_NO_LIMITS = {"subs": -1, "data": -1, "payload": -1}
_UNLIMITED = {**_NO_LIMITS, "imports": -1, "exports": -1, "wildcards": True}


def _seed(prefix: int) -> str:
    return str(nkeys.encode_seed(os.urandom(32), prefix).decode())


class Identity(msgspec.Struct, frozen=True, kw_only=True):
    """One instance's NATS identity: its user JWT and the seed of the key it names."""

    role: str
    name: str
    jwt: str
    seed: str


class Credentials(msgspec.Struct, frozen=True, kw_only=True):
    """A namespace's NATS secrets (schema 3: keys that issue identities; 2: role seeds; 1:
    passwords), or, with ``identity``, one instance's identity alone. Stored 0600."""

    schema_version: int = 3
    namespace: str
    seeds: dict[str, str] = {}  # schema 2: each role's user seed
    passwords: dict[str, str] = {}  # schema 1
    signing: dict[str, str] = {}  # schema 3: each role's scoped signing key seed
    account_key: str = ""  # schema 3: the account's public key (every file)
    operator: str = ""  # schema 3, the full file only: operator, account and system seeds
    account: str = ""
    system: str = ""
    created: int = 0  # the account JWT's issue time: the servers' preload never outdates a revocation
    identity: Identity | None = None
    identity_ttl_s: int = DEFAULT_IDENTITY_TTL_S  # schema 3: an identity expires this long after issue

    @classmethod
    def generate(cls, namespace: str) -> Credentials:
        """Fresh keys: an operator, the namespace's account, the system account, a key per role."""
        Subjects(namespace)  # validates the namespace
        account = _seed(nkeys.PREFIX_BYTE_ACCOUNT)
        return cls(
            namespace=namespace,
            signing={r: _seed(nkeys.PREFIX_BYTE_ACCOUNT) for r in ROLES},
            account_key=public_of(account),
            operator=_seed(nkeys.PREFIX_BYTE_OPERATOR),
            account=account,
            system=_seed(nkeys.PREFIX_BYTE_ACCOUNT),
            created=int(time.time()),
        )

    @property
    def decentralised(self) -> bool:
        """Whether these are schema 3's JWT credentials (the server runs in operator mode)."""
        return bool(self.account_key)

    def public_key(self, role: str) -> str:
        """The role's public nkey: its user (schema 2) or its scoped signing key (schema 3)."""
        seed = self.signing.get(role) or self.seeds.get(role)
        if seed is None:
            raise ConfigError(f"no credentials for role {role!r}")
        return public_of(seed)

    def save(self, path: Path) -> None:
        """Write the secrets, readable by their owner only (0600 in a 0700 directory)."""
        private_dir(path.parent)
        write_private(path, msgspec.json.encode(self))

    def only(self, role: str) -> Credentials:
        """These credentials with one role's secret alone: what a server of that role is given."""
        if self.identity is not None:
            raise ConfigError("an identity file cannot be narrowed further")
        if not any(role in d for d in (self.signing, self.seeds, self.passwords)):
            raise ConfigError(f"no credentials for role {role!r}; roles: {', '.join(ROLES)}")

        def pick(d: dict[str, str]) -> dict[str, str]:
            return {role: d[role]} if role in d else {}

        return Credentials(
            namespace=self.namespace,
            seeds=pick(self.seeds),
            passwords=pick(self.passwords),
            signing=pick(self.signing),
            account_key=self.account_key,
            identity_ttl_s=self.identity_ttl_s,
        )

    def issue(self, role: str, name: str) -> Credentials:
        """A new identity named ``name`` of ``role`` as an identity-only file's content: what a
        server hands each of its workers (it cannot make any other identity)."""
        ident = self._mint(role, name)
        return Credentials(namespace=self.namespace, account_key=self.account_key, identity=ident)

    def _mint(self, role: str, name: str) -> Identity:
        check_token(name, "identity name")
        if role in PARTICIPANT_ROLES and name in (COORDINATOR_LANE, COLLECTOR_LANE):
            raise ConfigError(f"identity name {name!r} is reserved")
        key = self.signing.get(role)
        if key is None:
            raise ConfigError(f"no signing key for role {role!r}; roles here: {', '.join(self.signing)}")
        user, now = _seed(nkeys.PREFIX_BYTE_USER), int(time.time())
        claims: dict[str, Any] = {
            "sub": public_of(user),
            "name": name,
            "nats": {"type": "user", "version": 2, "issuer_account": self.account_key},
        }
        if self.identity_ttl_s > 0:  # a copy that outlives its process stops working (``_renewal``)
            claims["exp"] = now + self.identity_ttl_s
        return Identity(role=role, name=name, jwt=encode_jwt(key, claims, issued_at=now), seed=user)

    def login(self, role: str, name: str | None = None) -> dict[str, str]:
        """How an instance ``name`` of ``role`` authenticates: schema 3 ``{"user_jwt", "nkey_seed"}``
        (a fresh identity, or this file's own), schema 2 ``{"nkey_seed"}``, schema 1
        ``{"user", "password"}``. Without a name a tool gets a unique one."""
        if self.identity is not None:
            i = self.identity
            if i.role != role or (name is not None and name != i.name):
                raise ConfigError(
                    f"this identity file is {i.role} {i.name!r}, not {role} {name or '(any)'!r}"
                )
            return {"user_jwt": i.jwt, "nkey_seed": i.seed}
        if role in self.signing:
            ident = self._mint(role, name or f"{role}-{secrets.token_hex(4)}")
            # the key renews the identity while its process lives, if it expires (``_renewal``)
            renews = {"signing_seed": self.signing[role]} if self.identity_ttl_s > 0 else {}
            return {"user_jwt": ident.jwt, "nkey_seed": ident.seed, **renews}
        if role in self.seeds:
            return {"nkey_seed": self.seeds[role]}
        if role in self.passwords:
            return {"user": role, "password": self.passwords[role]}
        raise ConfigError(f"no credentials for role {role!r}; roles: {', '.join(ROLES)}")

    # --- the server side (the full file only) ----------------------------------------

    def account_jwt(self, revocations: dict[str, int] | None = None, *, issued_at: int | None = None) -> str:
        """The namespace's account: JetStream on, one scoped signing key per role, and the
        identities revoked so far (user public key -> revoked before this time)."""
        s = Subjects(self.namespace)
        nats: dict[str, Any] = {
            "type": "account",
            "version": 2,
            "limits": {
                **_UNLIMITED,
                "conn": -1,
                "leaf": -1,
                "mem_storage": -1,
                "disk_storage": -1,
                "streams": -1,
                "consumer": -1,
            },
            "signing_keys": [
                {
                    "kind": "user_scope",
                    "key": public_of(seed),
                    "role": role,
                    "template": jwt_permissions(role, s),
                }
                for role, seed in sorted(self.signing.items())
            ],
        }
        if revocations:
            nats["revocations"] = dict(revocations)
        claims = {"sub": self.account_key, "name": f"rollcut-{self.namespace}", "nats": nats}
        return encode_jwt(self._need(self.operator), claims, issued_at=issued_at or self.created)

    def system_identity(self) -> Identity:
        """A user of the system account (the identity authority's: it reads connect advisories and
        pushes the account's revocations)."""
        user = _seed(nkeys.PREFIX_BYTE_USER)
        claims = {
            "sub": public_of(user),
            "name": "rollcut-authority",
            "nats": {"type": "user", "version": 2, "pub": {}, "sub": {}, **_NO_LIMITS},
        }
        token = encode_jwt(self._need(self.system), claims)
        return Identity(role="system", name="rollcut-authority", jwt=token, seed=user)

    def roles_by_key(self) -> dict[str, str]:
        """Each role by the public key of its scoped signing key (what a user JWT names as issuer)."""
        return {public_of(seed): role for role, seed in self.signing.items()}

    def _need(self, seed: str) -> str:
        if not seed:
            raise ConfigError("these are a server's credentials, not the full file: they sign no account")
        return seed

    def operator_config(self, resolver_dir: str) -> str:
        """The operator-mode block of a nats-server config (schema 3)."""
        op = encode_jwt(
            self._need(self.operator),
            {
                "sub": public_of(self.operator),
                "name": "rollcut",
                "nats": {"type": "operator", "version": 2, "system_account": public_of(self.system)},
            },
            issued_at=self.created,
        )
        limits = {**_UNLIMITED, "conn": -1, "leaf": -1}
        sys_claims = {
            "sub": public_of(self.system),
            "name": "SYS",
            "nats": {"type": "account", "version": 2, "limits": limits},
        }
        sys_jwt = encode_jwt(self.operator, sys_claims, issued_at=self.created)
        return "\n".join(
            [
                f"operator: {op}",
                f"system_account: {public_of(self.system)}",
                f"resolver: {{ type: full, dir: {json.dumps(resolver_dir)}, allow_delete: false }}",
                "resolver_preload: {",
                f"  {self.account_key}: {self.account_jwt()}",
                f"  {public_of(self.system)}: {sys_jwt}",
                "}",
                "",
            ]
        )


def role_file(path: Path, role: str) -> Path:
    """A file beside ``path`` (``<name>.<role>.json``, 0600) holding ``role``'s secret only, written
    from the full credentials at ``path``: a server reads its own role's credentials and no other's,
    so nothing that reaches one server's files can act as another role (the admin seed is never
    on a server's command line or in its files)."""
    out = path.with_name(f"{path.stem}.{role}.json")
    write_private(out, msgspec.json.encode(load_credentials(path).only(role)))
    return out


def load_credentials(path: Path) -> Credentials:
    """Read credentials written by ``rollcut nats`` (or the embedded server), or an identity file."""
    return read_record(path, Credentials, "credentials file")


MAX_IDENTITY_BYTES = 64 * 1024
"""The most a worker reads of the identity its parent hands it through a pipe (one is ~2 KB)."""


def identity_from_pipe(fd: int) -> tuple[Credentials, PipeRenewal]:
    """A worker's own identity, read from the pipe its parent wrote it into (its first line), and the
    renewals the parent writes after it (``_renewal``): no file ever holds it, so nothing of it is
    left behind when the worker or its parent is SIGKILLed."""
    pipe = open(fd, "rb", closefd=True)  # noqa: SIM115 (handed on: the renewals are read from it)
    data = pipe.readline(MAX_IDENTITY_BYTES + 1)
    try:
        if len(data) > MAX_IDENTITY_BYTES:
            raise ConfigError(f"the identity on fd {fd} is over {MAX_IDENTITY_BYTES} bytes")
        try:
            creds = msgspec.json.decode(data, type=Credentials)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ConfigError(f"the identity on fd {fd} is not valid: {exc}") from exc
        if creds.identity is None:
            raise ConfigError(f"fd {fd} holds credentials, not one identity")
    except ConfigError:
        pipe.close()
        raise
    return creds, PipeRenewal(pipe)


def server_authorization(creds: Credentials, resolver_dir: str = "jwt") -> str:
    """What nats-server's config needs to authenticate these credentials' clients: schema 3's
    operator block (the identities' resolver in ``resolver_dir``), else the ``authorization {}``
    block of per-role users."""
    if creds.decentralised:
        return creds.operator_config(resolver_dir)
    s = Subjects(creds.namespace)
    users = [
        {"nkey": creds.public_key(role), "permissions": permissions(role, s)}
        if role in creds.seeds
        else {"user": role, "password": creds.passwords[role], "permissions": permissions(role, s)}
        for role in ROLES
    ]
    # nats-server's config format accepts JSON values
    return "authorization {\n  users = " + json.dumps(users, indent=2) + "\n}\n"
