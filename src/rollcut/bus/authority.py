"""The identity authority: the newest identity of an instance name is the only one accepted.

Every participant instance makes its own NATS identity when it starts (``_auth``), so a
worker that crashed and was started again under the same name has a new user key,
and its old one must stop working: whoever kept a copy of the old worker's file could
otherwise act as the new worker. nats-server revokes a user key when the account's
JWT lists it; only the operator's key can sign that JWT, and no Gym server holds it.
This process does, beside the servers (the embedded server starts it; a deployment
runs ``python -m rollcut.bus.authority`` on its NATS hosts, docs/security.md).

It listens to the server's own connect advisories (system account), so nothing a
client says is trusted: for each connection of a participant role's identity it
knows the role (the signing key the server checked), the name and the issue time
from the JWT the server accepted. When a second user key connects under a name it
has seen, the older of the two (by issue time; on a tie, the one connected first)
is revoked: the account JWT is re-signed with it in ``revocations`` and pushed to
the servers' resolver, which closes its connection and refuses it from then on
(persisted in the resolver's directory, so a server restart keeps it).

Run while no authority runs: names first seen before it started are learnt from
their next connection. Revocations are capped (``MAX_REVOKED``): the oldest go
first, and only keys of long-dead instances ever reach that far.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import msgspec

from .._errors import ConfigError, RollcutError
from ._auth import PARTICIPANT_ROLES, Credentials
from ._jwt import decode_claims
from ._stream import BusConfig, connect

__all__ = ["MAX_REVOKED", "IdentityAuthority", "main"]

MAX_REVOKED = 100_000
_MAX_EVENT = 256 * 1024


class _Client(msgspec.Struct, frozen=True):
    jwt: str = ""
    issuer_key: str = ""
    user: str = ""


class _Connect(msgspec.Struct, frozen=True):
    client: _Client


_connect_decoder = msgspec.json.Decoder(_Connect)


class IdentityAuthority:
    """Revokes the superseded identities of participant instances (see the module)."""

    def __init__(self, creds: Credentials, url: str) -> None:
        if not creds.operator:
            raise ConfigError("the identity authority needs the full credentials file (the operator's key)")
        self.creds = creds
        self.url = url
        self._roles = creds.roles_by_key()  # once: every connect event asks
        self.latest: dict[tuple[str, str], tuple[int, str]] = {}  # (role, name) -> (issued, user key)
        self.revoked: OrderedDict[str, int] = OrderedDict()
        self._issued = 0
        self._nc: Any = None
        self._lock = asyncio.Lock()

    async def start(self) -> IdentityAuthority:
        ident = self.creds.system_identity()
        config = BusConfig(url=self.url, user_jwt=ident.jwt, nkey_seed=ident.seed, role="system")
        self._nc = await connect(config, name="rollcut-authority")
        await self._load_revocations()
        await self._nc.subscribe(f"$SYS.ACCOUNT.{self.creds.account_key}.CONNECT", cb=self._on_connect)
        await self._nc.flush()
        return self

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()

    async def _load_revocations(self) -> None:
        """The revocations the servers hold already (an authority started again goes on from them)."""
        with contextlib.suppress(Exception):
            msg = await self._nc.request(
                f"$SYS.REQ.ACCOUNT.{self.creds.account_key}.CLAIMS.LOOKUP", b"", timeout=5
            )
            claims = decode_claims(msg.data.decode())
            got = claims.get("nats", {}).get("revocations") or {}
            self.revoked.update({str(k): int(v) for k, v in list(got.items())[:MAX_REVOKED]})
            self._issued = int(claims.get("iat", 0))

    async def _on_connect(self, msg: Any) -> None:
        if len(msg.data) > _MAX_EVENT:
            return
        try:
            client = _connect_decoder.decode(msg.data).client
            claims = decode_claims(client.jwt)
        except (msgspec.DecodeError, msgspec.ValidationError, ConfigError):
            return  # not a user JWT connection (nothing to supersede)
        role = self._roles.get(client.issuer_key)
        name, issued, user = claims.get("name"), claims.get("iat"), claims.get("sub")
        if role not in PARTICIPANT_ROLES or not isinstance(name, str) or not isinstance(issued, int):
            return  # tools and coordinators have unique names: nothing supersedes them
        if not isinstance(user, str) or user in self.revoked:
            return
        seen = self.latest.get((role, name))
        if seen is None or seen[1] == user:
            self.latest[(role, name)] = (issued, user)
            return
        if issued >= seen[0]:  # the newer identity (a tie: the one that connected last) is the one kept
            self.latest[(role, name)] = (issued, user)
            await self.revoke(seen[1])
        else:
            await self.revoke(user)

    async def revoke(self, user: str) -> None:
        """Revoke user key ``user`` on every server of the account, now."""
        async with self._lock:
            self.revoked[user] = int(time.time()) + 1  # every JWT of that key issued until now
            while len(self.revoked) > MAX_REVOKED:
                self.revoked.popitem(last=False)
            self._issued = max(int(time.time()), self._issued + 1)  # a newer account JWT than any before
            token = self.creds.account_jwt(dict(self.revoked), issued_at=self._issued)
            reply = await self._nc.request("$SYS.REQ.CLAIMS.UPDATE", token.encode(), timeout=10)
            if b'"error"' in reply.data:
                print(f"rollcut authority: revocation of {user} refused: {reply.data[:300]!r}", flush=True)
            else:
                print(f"REVOKED {user}", flush=True)


async def _run(creds: Credentials, url: str, ready_file: str | None) -> None:
    authority = await IdentityAuthority(creds, url).start()
    print("READY rollcut-authority", flush=True)
    if ready_file:
        Path(ready_file).write_text("ready\n")  # noqa: ASYNC240  (once, a few bytes)
    try:
        await asyncio.Event().wait()
    finally:
        await authority.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m rollcut.bus.authority --url URL [--credentials FILE]`` (else the file on stdin)."""
    parser = argparse.ArgumentParser(prog="rollcut-authority", description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--credentials", help="the full credentials file (default: read from stdin)")
    parser.add_argument("--ready-file", help="a file to create once it listens")
    args = parser.parse_args(argv)
    try:
        if args.credentials:
            with open(args.credentials, "rb") as f:
                data = f.read(1 << 20)
        else:
            data = sys.stdin.buffer.read(1 << 20)
        creds = msgspec.json.decode(data, type=Credentials)
        asyncio.run(_run(creds, args.url, args.ready_file))
    except (msgspec.DecodeError, msgspec.ValidationError, OSError) as exc:
        print(f"rollcut authority: unreadable credentials: {exc}", file=sys.stderr)
        return 2
    except RollcutError as exc:
        print(f"rollcut authority: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
