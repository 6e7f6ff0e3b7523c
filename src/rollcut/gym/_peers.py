"""Several workers behind one port: each rollout's requests reach the worker that holds it.

The kernel hands a new connection to whichever worker accepts first, but a
rollout's live state (a resources session, a model call being generated or
joined, an agent's run) is in one worker's memory. So every worker routes:
the *owner* of a rollout is ``blake2b(rollout_id) mod K``, the same in every
worker and every restart with K workers; a request that carries a rollout's
identity and arrived at another worker is passed, whole and unchanged, to the
owner over the owner's private unix socket, and the owner's answer (streamed
as it comes) goes back. A request without identity (``/healthz``, ``/tools``,
``/v1/models``) is served where it arrived, except ``/rollcut/stats``: any
worker answers it for all of them (counters summed, each worker's own under
``workers``).

Why routing and not "every worker rebuilds a session from the log on a miss"
(see ``docs/workers.md``): a restart-only environment's state is not in the
log at all; an in-flight model call that a retry must join, a verification
being waited for and a replay queue's position are process memory; and a
cache that must prove itself fresh pays a JetStream round trip on every call,
while concurrent writers would run a tool twice and throw one result away.
Routing keeps one writer per session by construction, so the session lock
orders its calls as with one worker.

The owner's socket is bound by the parent, before any worker starts, and
inherited: while a worker restarts, connections to it wait in the socket's
backlog instead of failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any

import httpx
import msgspec

from .wire import (
    NG_ROLLOUT_ID,
    ROLLOUT_HEADER,
    SESSION_COOKIE,
    ErrorKind,
    GymError,
    error_body_for,
    split_ng_path_id,
)

__all__ = ["FORWARDED_HEADER", "PeerRouter", "Peers", "bind_peer_sockets", "owner_of", "routing_key"]

STATS_PATH = "/rollcut/stats"
"""Every server's counters; with several workers, the sum over all of them (each under ``workers``)."""
FORWARDED_HEADER = "x-rollcut-forwarded-to"
"""On an answer another worker gave: that worker's index (absent when the accepting worker answered)."""
_LOCAL = b"x-rollcut-worker-local"  # asks a worker for its own stats only
_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"te", b"content-length"})
_ANSWER_SKIP = frozenset({"connection", "keep-alive", "transfer-encoding", "date", "server"})


def owner_of(rollout_id: str, workers: int) -> int:
    """The index of the worker that holds ``rollout_id`` among ``workers``: stable across processes
    and restarts (not Python's salted ``hash``)."""
    digest = hashlib.blake2b(rollout_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % workers


def bind_peer_sockets(directory: str, workers: int) -> list[socket.socket]:
    """The parent's part: one listening unix socket per worker, ``<directory>/w<i>.sock``."""
    out = []
    for i in range(workers):
        path = os.path.join(directory, f"w{i}.sock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        sock.listen(2048)
        sock.set_inheritable(True)
        out.append(sock)
    return out


@dataclass
class Peers:
    """This worker's place among its server's workers, and clients for the others."""

    index: int
    count: int
    directory: str
    listener: socket.socket | None = None
    """This worker's own private socket (inherited from the parent), served besides the port."""
    _clients: dict[int, httpx.AsyncClient] = field(default_factory=dict, repr=False)

    def owner(self, rollout_id: str) -> int:
        """Which worker holds ``rollout_id``."""
        return owner_of(rollout_id, self.count)

    def owns(self, rollout_id: str) -> bool:
        """Whether this worker holds ``rollout_id`` (a restore builds only what it owns)."""
        return self.count <= 1 or self.owner(rollout_id) == self.index

    def client(self, i: int) -> httpx.AsyncClient:
        """A pooled client to worker ``i``'s private socket (no timeout: a run may take an hour)."""
        c = self._clients.get(i)
        if c is None:
            transport = httpx.AsyncHTTPTransport(uds=os.path.join(self.directory, f"w{i}.sock"))
            c = self._clients[i] = httpx.AsyncClient(
                transport=transport, timeout=None, limits=httpx.Limits(max_connections=1000)
            )
        return c

    async def aclose(self) -> None:
        """Close the clients to the other workers."""
        for c in self._clients.values():
            await c.aclose()
        self._clients.clear()


def routing_key(scope: dict[str, Any], body: bytes) -> str | None:
    """The rollout id a request names, wherever it says it (header, path prefix, cookie, or NeMo Gym
    body field); None if it names none. Only for routing: the owner validates identity in full and
    refuses a bad one in the API's shape."""
    headers: dict[bytes, bytes] = {k.lower(): v for k, v in scope.get("headers") or []}
    rid = headers.get(ROLLOUT_HEADER.encode())
    if rid:
        return rid.decode("latin-1")
    path: str = scope.get("path", "")
    parts = path.split("/", 3)
    if len(parts) > 2 and parts[1] == "r":
        return parts[2]
    if len(parts) > 2 and parts[1] == "ng-rollout":
        return split_ng_path_id(parts[2]).rollout_id
    cookie = headers.get(b"cookie")
    if cookie:
        with contextlib.suppress(Exception):  # a cookie header that does not parse names nothing
            morsel = SimpleCookie(cookie.decode("latin-1")).get(SESSION_COOKIE)
            if morsel is not None and ":" in morsel.value:
                return morsel.value.rsplit(":", 1)[0]
    if NG_ROLLOUT_ID.encode() in body:
        with contextlib.suppress(msgspec.MsgspecError, RecursionError):
            decoded = msgspec.json.decode(body)
            if isinstance(decoded, dict) and isinstance(decoded.get(NG_ROLLOUT_ID), str):
                return str(decoded[NG_ROLLOUT_ID])
    return None


class PeerRouter:
    """ASGI middleware: a request for a rollout another worker owns goes to that worker.

    It sits inside the body limit (the body it buffers is bounded) and outside
    the identity prefix (the owner sees the request exactly as it was sent).
    Which workers exist comes from ``app.state.peers`` (set when serving); an
    app without it, or with one worker, serves everything itself.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        peers: Peers | None = getattr(getattr(scope.get("app"), "state", None), "peers", None)
        if scope.get("type") != "http" or peers is None or peers.count <= 1:
            await self.app(scope, receive, send)
            return
        first = await receive()
        body: bytes = first.get("body", b"") if first.get("type") == "http.request" else b""
        more = bool(first.get("more_body"))
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return dict(await receive())
            sent = True
            return dict(first)

        # `and` short-circuits: the headers are scanned only for the stats route
        if (
            scope.get("path") == STATS_PATH
            and scope.get("method") == "GET"
            and not any(k.lower() == _LOCAL for k, _ in scope.get("headers") or [])
        ):
            await self._all_stats(peers, send)
            return
        rid = None if more else routing_key(scope, body)
        owner = peers.owner(rid) if rid is not None else peers.index
        if owner == peers.index:
            await self.app(scope, replay, send)
            return
        await self._forward(peers, owner, scope, body, send)

    async def _all_stats(self, peers: Peers, send: Any) -> None:
        """``/rollcut/stats`` of the whole server: every worker's own, counters summed."""
        answers = await asyncio.gather(
            *(
                peers.client(i).get(f"http://worker{STATS_PATH}", headers={_LOCAL.decode(): "1"})
                for i in range(peers.count)
            ),
            return_exceptions=True,
        )
        each: list[dict[str, Any]] = []
        for i, a in enumerate(answers):
            ok = isinstance(a, httpx.Response) and a.status_code == 200
            each.append(
                a.json() if isinstance(a, httpx.Response) and ok else {"worker": i, "down": repr(a)[:200]}
            )
        total: dict[str, Any] = {}
        for one in each:
            for k, v in one.items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    total[k] = total.get(k, 0) + v
                else:
                    total.setdefault(k, v)
        total["workers"] = each
        await _json(send, 200, msgspec.json.encode(total))

    async def _forward(self, peers: Peers, owner: int, scope: dict[str, Any], body: bytes, send: Any) -> None:
        path = scope.get("raw_path") or scope.get("path", "/").encode()
        query = scope.get("query_string") or b""
        target = path.decode("latin-1") + (("?" + query.decode("latin-1")) if query else "")
        headers = [(k, v) for k, v in scope.get("headers") or [] if k.lower() not in _HOP]
        client = peers.client(owner)
        try:
            request = client.build_request(
                scope["method"], f"http://worker{target}", headers=headers, content=body
            )
        except (httpx.InvalidURL, ValueError) as exc:  # a target no HTTP client can send on
            err = GymError(ErrorKind.BAD_REQUEST, f"the request target does not parse: {exc}")
            await _refuse(err, send, scope.get("path", ""))
            return
        try:
            answer = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            why = f"worker {owner} of this server, which holds this rollout, did not answer ({exc!r}); retry"
            err = GymError(ErrorKind.WORKER_UNAVAILABLE, why, retry_after_s=1.0)
            await _refuse(err, send, scope.get("path", ""))
            return
        try:
            out = [(k, v) for k, v in answer.headers.raw if k.decode("latin-1").lower() not in _ANSWER_SKIP]
            out.append((FORWARDED_HEADER.encode(), str(owner).encode()))  # which worker answered
            await send({"type": "http.response.start", "status": answer.status_code, "headers": out})
            async for chunk in answer.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await answer.aclose()


async def _json(send: Any, status: int, data: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", b"application/json"), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _refuse(err: GymError, send: Any, path: str = "") -> None:
    """An error answer in the API's shape (this module sits below the app's own error handlers)."""
    retry = [(b"retry-after", str(max(1, round(err.retry_after_s))).encode())] if err.retry_after_s else []
    await _json(send, err.status, msgspec.json.encode(error_body_for(path, err)), retry)
