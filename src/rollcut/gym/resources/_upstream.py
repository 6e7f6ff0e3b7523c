"""A resources server rollcut did not write, continued by giving a fresh session the same calls again.

NeMo Gym's resources servers keep their sessions in their own memory, behind a signed session
cookie; rollcut cannot read that state, and a codec per server is a port per server. What it can
do is journal: every ``/seed_session`` and tool call of an attempt is sent to the unmodified
server (the *upstream*) and its answer is logged on the bus (the seed request and answer in the
session's ``resources.seeded`` state, each call's request and answer as a ``resources.mutated``
delta) before it goes back to the agent. A continued attempt's session is a fresh upstream
session, seeded with the journaled seed request and given the journaled calls below the cut in
order; each answer must equal the journaled one, else the rollout starts over from its input
(:class:`NotContinuable`, naming the call and the first differing field). Never a guess: a
server is continued this way only when it is declared replayable (its answers are a function of
its seed and its calls), seeded afresh when declared stateless, and restarted otherwise.

What the upstream answered and what the journal says can part only when the journal write
fails after the upstream applied a call; the session is then *broken* (its next call is refused
as not continuable) and a restore rebuilds it without that call, as a call never made.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx
import msgspec

from ...participants import CheckpointMode
from ...replay import DIVERGED_ON_REPLAY
from .._normalise import Normalise
from ..wire import ErrorKind, GymError
from ._at_cut import NotContinuable
from ._env import Environment, ToolResult

__all__ = ["Journaled", "UpstreamEnvironment", "UpstreamSession", "first_difference"]

OWN_ROUTES = frozenset(
    {"/seed_session", "/close_session", "/verify", "/aggregate_metrics", "/reverify_mode", "/run"}
)
"""NeMo Gym's resources routes that are not tools (``SimpleResourcesServer.setup_webserver``)."""

NO_ROUTE = 404
REFUSED_UNCHANGED = 422
"""FastAPI's answer to a body its model refuses: the handler never ran, the session is as it was."""


class Journaled(msgspec.Struct, frozen=True, kw_only=True):
    """One call of a session as the journal keeps it: the tool, what it was sent, what it answered."""

    tool: str
    arguments: Any
    answer: Any


class _SessionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A session's state on the log: the seed request and answer, and every call it was given."""

    v: int = 1
    seed: Any
    seed_answer: Any
    calls: list[Journaled] = []


@dataclass(eq=False)
class _Link:
    """The one upstream session behind a session's states: its cookie, and which state it matches."""

    cookie: str
    generation: int = 0  # the upstream process it lives in (a restarted one has none of its sessions)
    owner: UpstreamSession | None = None
    broken: str | None = None


@dataclass(eq=False)
class UpstreamSession:
    """A session of the upstream, and the journal that rebuilds it."""

    link: _Link
    seed: Any
    seed_answer: Any
    calls: list[Journaled] = field(default_factory=list)


def first_difference(
    journaled: Any, answered: Any, where: str = "", *, normalise: Normalise | None = None
) -> str | None:
    """Where two JSON values first differ (``count: 7 != 9``), or None when they are equal; with
    ``normalise``, the declared fields (a value that changes per process: an id, a timestamp) are
    left out of both first."""
    if normalise:
        journaled, answered = (
            normalise.apply(msgspec.json.decode(msgspec.json.encode(v))) for v in (journaled, answered)
        )
    if isinstance(journaled, dict) and isinstance(answered, dict):
        for key in sorted(journaled.keys() | answered.keys(), key=str):
            if key not in journaled or key not in answered:
                side = (
                    "in the answer, not the journal"
                    if key not in journaled
                    else "in the journal, not the answer"
                )
                return f"{where}{key}: {side}"
            found = first_difference(journaled[key], answered[key], f"{where}{key}.")
            if found:
                return found
        return None
    if isinstance(journaled, list) and isinstance(answered, list):
        for i, (a, b) in enumerate(zip(journaled, answered, strict=False)):
            found = first_difference(a, b, f"{where}{i}.")
            if found:
                return found
        if len(journaled) != len(answered):
            return f"{where.rstrip('.') or 'the answer'}: {len(journaled)} items != {len(answered)}"
        return None
    if journaled != answered or type(journaled) is not type(answered):
        return f"{where.rstrip('.') or 'the answer'}: {journaled!r} != {answered!r}"
    return None


class UpstreamEnvironment(Environment):
    """An unmodified HTTP resources server behind rollcut's journal (NeMo Gym's shape).

    ``name`` is the upstream server's (the sessions and the rows name it); ``mode`` its declared
    level: ``event_sourced`` (replayable: rebuilt by replay), ``stateless`` (seeded afresh), or
    ``restart_only``. Tools are the upstream's own POST routes, read from its OpenAPI document.
    ``normalise``: the declared fields of its answers that change per process (``PATH`` or
    ``PATH~REGEX``, as an opaque agent's requests), left out when a replayed answer is compared."""

    name: ClassVar[str] = "upstream"
    whole_rows: ClassVar[bool] = True
    implicit_sessions: ClassVar[bool] = True
    bare_answers: ClassVar[bool] = True
    verification: ClassVar[str] = "wait"  # the upstream's verify reads its session: a cut waits for it
    reverify: ClassVar[str | None] = "unknown"

    def __init__(
        self,
        server: str,
        url: str,
        *,
        level: CheckpointMode = "restart_only",
        timeout_s: float = 120.0,
        normalise: Normalise | None = None,
    ) -> None:
        self.name = server  # type: ignore[misc]  # an instance per upstream server, named as it is
        self.mode = level  # type: ignore[misc]
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.normalise = normalise or Normalise()
        self._routes: dict[str, dict[str, Any]] = {}
        self._tools: dict[str, Any] = {}
        self.generation = 0  # bumped by whoever restarts the upstream: its sessions are gone
        self._http: httpx.AsyncClient | None = None
        self._closing: set[asyncio.Task[Any]] = set()

    # --- the upstream -------------------------------------------------------------------

    def discover(self) -> None:
        """Read the upstream's tools (its POST routes other than NeMo Gym's own) from its OpenAPI
        document; called once before serving."""
        doc = httpx.get(f"{self.url}/openapi.json", timeout=self.timeout_s).raise_for_status().json()
        schemas = doc.get("components", {}).get("schemas", {})
        for path, ops in doc.get("paths", {}).items():
            if path in OWN_ROUTES or "post" not in ops or path.count("/") != 1:
                continue
            body = ops["post"].get("requestBody", {}).get("content", {}).get("application/json", {})
            ref = body.get("schema", {}).get("$ref", "")
            self._routes[path[1:]] = schemas.get(ref.rsplit("/", 1)[-1], {}) if ref else {}
        self._tools = {name: self._tool(name) for name in self._routes}  # made once: asked at every call

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:  # a jar that keeps nothing: each session sends its own cookie, no other's
            jar = http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
            self._http = httpx.AsyncClient(base_url=self.url, timeout=self.timeout_s, cookies=jar)
        return self._http

    async def _send(self, path: str, body: Any, cookie: str | None) -> httpx.Response:
        headers = {"cookie": cookie} if cookie else {}
        try:
            return await self._client().post(path, json=body, headers=headers)
        except httpx.TimeoutException as exc:  # hung: as good as dead for this call, said apart
            what = f"{self.name}: the upstream did not answer {path} within {self.timeout_s:g} s"
            raise GymError(ErrorKind.HTTP_ERROR, what, status=504) from exc
        except httpx.HTTPError as exc:
            raise GymError(
                ErrorKind.HTTP_ERROR, f"{self.name}: the upstream did not answer {path}: {exc!r}", status=502
            ) from exc

    def _answer(self, resp: httpx.Response, what: str) -> Any:
        if resp.status_code == REFUSED_UNCHANGED:
            raise GymError(ErrorKind.BAD_REQUEST, f"{self.name} refused {what}: {resp.text[:2000]}")
        try:
            answer = resp.json()
        except ValueError:
            answer = None
        if not resp.is_success or answer is None:
            status = resp.status_code if 400 <= resp.status_code < 500 else 502
            raise GymError(
                ErrorKind.HTTP_ERROR,
                f"{self.name} answered {what} with {resp.status_code}: {resp.text[:2000]}",
                status=status,
            )
        return answer

    def _usable(self, link: _Link) -> _Link:
        """``link``, unless its session cannot be shown to be the journal's: then not continuable."""
        if link.generation != self.generation:
            link.broken = link.broken or "its upstream was restarted: the session's state is gone"
        if link.broken:
            raise GymError(ErrorKind.NOT_CONTINUABLE, f"{self.name}: {link.broken}")
        return link

    async def ready(self) -> None:
        """Before a call: an environment that runs its upstream starts it again here if it died
        (and bumps :attr:`generation`, so no session of the dead one is used)."""
        return None

    async def _seeded(self, seed: Any) -> tuple[_Link, Any]:
        await self.ready()
        resp = await self._send("/seed_session", seed, None)
        # a server without the route (NeMo Gym's Gymnasium servers start at /reset) still sets the cookie
        answer = None if resp.status_code == NO_ROUTE else self._answer(resp, "/seed_session")
        cookie = "; ".join(f"{k}={v}" for k, v in resp.cookies.items())
        if not cookie:
            what = f"{self.name}: /seed_session set no session cookie"
            raise GymError(ErrorKind.HTTP_ERROR, what, status=502)
        return _Link(cookie, generation=self.generation), answer

    # --- the environment's hooks ----------------------------------------------------------

    def tools(self) -> dict[str, Any]:
        return self._tools

    def _tool(self, name: str) -> Any:
        async def run(draft: UpstreamSession, args: dict[str, Any]) -> ToolResult:
            await self.ready()
            link = self._usable(draft.link)
            try:
                resp = await self._send(f"/{name}", args, link.cookie)
            except GymError:  # no answer: applied or not, or the upstream and its sessions gone
                link.broken = f"the upstream did not answer /{name}: the session cannot be shown the same"
                raise
            if resp.status_code != REFUSED_UNCHANGED:
                link.owner = draft  # the upstream has applied it: only the draft matches it now
            answer = self._answer(resp, f"/{name}")
            draft.calls.append(Journaled(tool=name, arguments=args, answer=answer))
            return answer, {"answer": answer}

        return run

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": schema.get("description") or name,
                    "parameters": {
                        "type": "object",
                        "properties": schema.get("properties", {}),
                        "required": schema.get("required", []),
                    },
                },
            }
            for name, schema in self._routes.items()
        ]

    async def seed(self, args: dict[str, Any]) -> UpstreamSession:
        link, answer = await self._seeded(args)
        s = UpstreamSession(link, args, answer)
        link.owner = s
        return s

    async def verify(self, state: UpstreamSession, args: dict[str, Any]) -> dict[str, Any]:
        await self.ready()
        link = self._usable(state.link)
        out = self._answer(await self._send("/verify", args, link.cookie), "/verify")
        return out if isinstance(out, dict) else {"reward": 0.0, "answer": out}

    def copy(self, state: UpstreamSession) -> UpstreamSession:
        return UpstreamSession(state.link, state.seed, state.seed_answer, list(state.calls))

    def close(self, state: Any) -> None:
        if not isinstance(state, UpstreamSession) or state.link.owner is not state:
            return  # a superseded state, or a draft the upstream never applied
        state.link.broken = state.link.broken or "its upstream session was closed"
        task = asyncio.get_running_loop().create_task(self._send("/close_session", {}, state.link.cookie))
        self._closing.add(task)  # best effort: the upstream frees the session's memory
        task.add_done_callback(self._closed)

    def _closed(self, task: asyncio.Task[Any]) -> None:
        self._closing.discard(task)
        if not task.cancelled():
            task.exception()  # seen: a server that could not close a session has nothing more to say

    # --- crossing a checkpoint: the journal, given again ---------------------------------

    def export_state(self, state: UpstreamSession) -> bytes:
        record = _SessionRecord(seed=state.seed, seed_answer=state.seed_answer, calls=state.calls)
        return msgspec.json.encode(record)

    async def import_state(self, blob: bytes, codec_version: int) -> UpstreamSession:
        record = msgspec.json.decode(blob, type=_SessionRecord)
        s = await self._reseeded(record.seed, record.seed_answer)
        for call in record.calls:
            s = await self.apply_delta(s, call.tool, call.arguments, {"answer": call.answer})
        return s

    async def _reseeded(self, seed: Any, journaled: Any) -> UpstreamSession:
        s = await self.seed(seed)
        differs = first_difference(journaled, s.seed_answer, normalise=self.normalise)
        if differs is not None:
            self.close(s)
            raise NotContinuable(f"{self.name}: /seed_session {DIVERGED_ON_REPLAY} ({differs})")
        return s

    async def apply_delta(
        self, state: UpstreamSession, tool: str, arguments: Any, delta: Any
    ) -> UpstreamSession:
        journaled = delta.get("answer") if isinstance(delta, dict) else None
        draft = self.copy(state)
        try:
            await self._tools[tool](draft, arguments)
        except GymError as exc:
            self.close(draft)
            where = f"{self.name}: /{tool} call {len(state.calls) + 1}"
            raise NotContinuable(f"{where} failed on replay: {exc}") from exc
        differs = first_difference(journaled, draft.calls[-1].answer, normalise=self.normalise)
        if differs is not None:
            self.close(draft)
            raise NotContinuable(
                f"{self.name}: /{tool} call {len(state.calls) + 1} {DIVERGED_ON_REPLAY} ({differs})"
            )
        return draft
