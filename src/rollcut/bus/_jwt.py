"""NATS's decentralised JWTs: the few claims rollcut issues, signed with nkeys.

A NATS JWT is ``base64url(header).base64url(claims).base64url(ed25519 signature)``,
the header ``{"typ":"JWT","alg":"ed25519-nkey"}``, the signature made with the
issuer's nkey (the ``iss`` claim) over the first two parts. Field names and
meanings are NATS's (ADR-8 and the jwt v2 schema of ``nats-io/jwt``).

Why not a library: the one Python package for it (``nats-jwt`` 0.2) calls itself
"not well-tested", pins ``pytz<2025`` and pulls dataclasses-json, pycryptodome and
dacite. What rollcut needs is four claim shapes, an encoding and a signature that
``nkeys`` already makes; the server is the judge of every token (a wrong one is
refused at connect), and the tests connect with every kind this module writes.
"""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

import msgspec
import nkeys

from .._errors import ConfigError

__all__ = ["decode_claims", "encode_jwt", "public_of"]

_HEADER = msgspec.json.encode({"typ": "JWT", "alg": "ed25519-nkey"})
_MAX_JWT = 64 * 1024


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def public_of(seed: str) -> str:
    """The public key of an nkey seed (``U…``, ``A…``, ``O…``)."""
    return str(nkeys.from_seed(seed.encode()).public_key.decode())


def encode_jwt(issuer_seed: str, claims: dict[str, Any], *, issued_at: int | None = None) -> str:
    """``claims`` as a NATS JWT issued (``iss``) and signed by ``issuer_seed``.

    ``iat`` is set (now, or ``issued_at``) and ``jti`` is the claims' SHA-256 digest,
    so two tokens with the same content have the same id, as NATS's own tools do.
    """
    body = {**claims, "iat": int(time.time()) if issued_at is None else issued_at}
    body["iss"] = public_of(issuer_seed)
    body.pop("jti", None)
    digest = hashlib.sha256(msgspec.json.encode(body, order="sorted")).digest()
    body["jti"] = base64.b32encode(digest).decode().rstrip("=")
    signing_input = f"{_b64(_HEADER)}.{_b64(msgspec.json.encode(body))}"
    signature = nkeys.from_seed(issuer_seed.encode()).sign(signing_input.encode())
    return f"{signing_input}.{_b64(signature)}"


def decode_claims(token: str) -> dict[str, Any]:
    """The claims of a NATS JWT, unverified: for tokens the server itself hands over (its connect
    advisories carry the token it accepted). Bounded (64 KiB) and strict: a ConfigError otherwise."""
    if not isinstance(token, str) or len(token) > _MAX_JWT or token.count(".") != 2:
        raise ConfigError("not a NATS JWT")
    try:
        claims = msgspec.json.decode(_unb64(token.split(".")[1]))
    except (ValueError, msgspec.DecodeError) as exc:
        raise ConfigError(f"a NATS JWT whose claims do not decode: {exc!r}") from exc
    if not isinstance(claims, dict):
        raise ConfigError("a NATS JWT whose claims are not an object")
    return claims
