"""When is a replayed agent's request "the same request" as the journaled one?

The relay compares the ``n``-th request of a restarted agent with the ``n``-th
of the journal by a digest over three things (``docs/opaque-agents.md``):

- the **method**, upper-cased;
- the **route**: the path under the relay's identity prefix (``/v1/chat/completions``,
  ``/tools/counter/add``) and the query string with its parameters sorted;
- the **body**: a JSON body is decoded and encoded again canonically (object keys
  sorted at every level, no insignificant whitespace, strings as UTF-8 without
  escapes, numbers in their shortest form), so two serialisations of the same value
  are the same request; any other body is taken byte for byte; an empty body is empty.

Nothing is dropped from a body by default: not ``stream`` (a streamed answer cannot be
replayed to a caller that asked for a plain one), not ``user``, not sampling parameters. An
agent that sends a timestamp, a random id or a nonce in its requests is not replayable, and
the digest says so at its first such request; that is the point. Headers are not part of it:
clients vary them (SDK versions, retry counters, trace ids) without changing what is asked.

An agent whose harness puts such a value in every request (Claude Code's session id, the
date in its system prompt) declares, per agent server, which fields are normalised away
(:class:`Normalise`, ``--normalise RULE``): a rule ``PATH`` drops the value at a dotted path
(``*`` is any key or list index), a rule ``PATH~REGEX`` replaces each match of ``REGEX`` in
the strings at ``PATH`` with ``<normalised>``. ``REGEX`` is RE2's syntax, matched by RE2 (no
backtracking: time linear in the request, so an operator's rule such as ``(x+x+)+y`` cannot stall
the agent server on one request, issue 49). Nothing is normalised unless declared, each rule
is justified in docs/opaque-agents.md, and the rules are part of what a journal was written
under: an agent server with other rules digests differently, so its replay diverges (fails
closed) rather than matching what the rules would not have matched.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

import msgspec
import re2

from .._errors import ConfigError

__all__ = ["Normalise", "canonical_body", "normalised_route", "request_digest"]

_encoder = msgspec.json.Encoder(order="sorted")
_PATH = re.compile(r"^[A-Za-z0-9_*-]+(\.[A-Za-z0-9_*-]+)*$")
MARK = "<normalised>"
_RE2 = re2.Options()
_RE2.log_errors = False  # a rule that does not parse is a ConfigError, not a line on stderr


@dataclass(frozen=True)
class _Rule:
    path: tuple[str, ...]
    pattern: Any  # a compiled RE2 expression, or None: drop the value


class Normalise:
    """An agent's declared normalisation rules (``PATH`` or ``PATH~REGEX``), checked when the agent
    server starts: a rule that does not parse is a :class:`ConfigError` naming it."""

    def __init__(self, rules: Sequence[str] = ()) -> None:
        self.rules: list[_Rule] = []
        for rule in rules:
            path, sep, pattern = rule.partition("~")
            if not _PATH.match(path) or (sep and not pattern):
                raise ConfigError(
                    f"normalise rule {rule!r}: expected PATH or PATH~REGEX (PATH dotted, * any)"
                )
            try:
                compiled = re2.compile(pattern, options=_RE2) if sep else None
            except re2.error as exc:
                why = (
                    exc.args[0].decode(errors="replace")
                    if exc.args and isinstance(exc.args[0], bytes)
                    else exc
                )
                raise ConfigError(
                    f"normalise rule {rule!r}: {why} (rules are RE2 expressions: no backreference, "
                    "no lookaround; they run in time linear in the request)"
                ) from exc
            self.rules.append(_Rule(tuple(path.split(".")), compiled))

    def __bool__(self) -> bool:
        return bool(self.rules)

    def apply(self, value: Any) -> Any:
        """``value`` (decoded JSON) with every rule applied, in place."""
        for rule in self.rules:
            _apply(value, rule.path, rule.pattern)
        return value


def _children(node: Any, key: str) -> list[tuple[Any, Any]]:
    """(container, key) pairs a path step names in ``node``: one key or index, or all of them."""
    if isinstance(node, dict):
        return [(node, k) for k in node] if key == "*" else [(node, key)] if key in node else []
    if isinstance(node, list):
        if key == "*":
            return [(node, i) for i in range(len(node))]
        return [(node, int(key))] if key.isdigit() and int(key) < len(node) else []
    return []


def _apply(node: Any, path: tuple[str, ...], pattern: Any) -> None:
    for container, key in _children(node, path[0]):
        if len(path) > 1:
            _apply(container[key], path[1:], pattern)
        elif pattern is None:
            container[key] = MARK  # kept as a mark, so a request without the field still differs
        elif isinstance(container[key], str):
            container[key] = pattern.sub(MARK, container[key])


def canonical_body(body: bytes, content_type: str = "", normalise: Normalise | None = None) -> bytes:
    """The body the digest is taken over: canonical JSON for a JSON body (with the agent's declared
    rules applied), else the bytes as sent."""
    if not body:
        return b""
    if "json" in content_type.lower() or not content_type:
        try:
            value = msgspec.json.decode(body)
        except (msgspec.DecodeError, RecursionError):
            return body  # not JSON after all: byte for byte
        return _encoder.encode(normalise.apply(value) if normalise else value)
    return body


def normalised_route(path: str, query: str = "") -> str:
    """The path and its query parameters in sorted order (``a=1&b=2`` and ``b=2&a=1`` are one route)."""
    pairs = sorted(parse_qsl(query, keep_blank_values=True))
    return f"{path}?{urlencode(pairs)}" if pairs else path


def request_digest(
    method: str, route: str, body: bytes, content_type: str = "", normalise: Normalise | None = None
) -> str:
    """The digest a journaled request and its replay must share (blake2b-256, hex)."""
    h = hashlib.blake2b(digest_size=32)
    h.update(method.upper().encode())
    h.update(b"\n")
    h.update(route.encode())
    h.update(b"\n")
    h.update(canonical_body(body, content_type, normalise))
    return h.hexdigest()
