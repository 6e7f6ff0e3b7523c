"""The egress relay: every request an opaque agent makes, journaled, and replayed after a crash.

The agent is pointed at ``<relay>/r/<rollout>/<attempt>/v1`` (its OpenAI base
URL) and ``<relay>/r/<rollout>/<attempt>/tools/<env>`` (its tools). A live
request goes on to the model server or the resources server with the rollout's
identity; their answer is appended as ``relay.exchange`` ``n`` of the lineage
(method, route, digest of the normalised request, status, content type and the
answer's bytes, or a stream's chunks) *before* the agent gets it: the last
chunk of a stream is held back until the record is durable.

A restarted agent (the next attempt, from its original input) is answered from
the lineage's journal, request ``n`` by exchange ``n``, byte for byte, with no
upstream call, as long as each request has the journaled one's digest. Past
the journal's end it goes live. A request that differs is a *divergence*:
recorded (``relay.diverged``), then ``fresh_dispatch`` (the agent is stopped
and the rollout starts over from its input) or, for an environment whose tools
are stateless, ``go_live`` (the rest of the journal is abandoned). A history
is never half journal, half something else.

At a checkpoint the relay holds nothing the log does not: its prepare only
closes admission to *new live* requests (held, not refused, until the
checkpoint ends; replays go on) and answers at once. A live model call in
flight is cut by the model server's own prepare, like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable

import httpx
from fastapi.responses import Response, StreamingResponse

from ..._tracing import SpanKind, current, of_attempt, span
from ...bus import EventLog, RelayDiverged, RelayExchange, RelayReplayed
from ...participants import Participant, PrepareReport
from .._attempts import sent_when_admitted
from .._capability import DivergencePolicy
from .._normalise import Normalise
from .._stats import RELAY_STATS, tally
from .._writes import append_or_refuse, envelope
from ..wire import REVISION_HEADER, ErrorKind, GymError, Identity, error_from_response, identity_headers
from ._exchange import Outgoing, Pending, RelayRun, ends_in_error, journaled, refused, replayed, revision_of

__all__ = ["MAX_JOURNALED_BYTES", "Relay", "RelayRun"]

MAX_JOURNALED_BYTES = 768 * 1024
"""The largest answer kept in the journal; a larger one reaches the agent but is recorded as
``oversize``, and a replay that gets to it diverges (an event holds at most ~1 MiB)."""


class Relay:
    """Journals, replays and forwards an opaque agent's requests; one per agent worker."""

    def __init__(
        self,
        log: EventLog,
        *,
        instance: str,
        model_url: str,
        resources: dict[str, str],
        http: httpx.AsyncClient,
        participant: Participant | None = None,
        on_divergence: DivergencePolicy = "fresh_dispatch",
        admission_wait_s: float = 120.0,
        max_journaled_bytes: int = MAX_JOURNALED_BYTES,
        normalise: Normalise | None = None,
    ) -> None:
        self.log, self.instance, self.http = log, instance, http
        self.normalise = normalise or Normalise()
        self.model_url = model_url.rstrip("/")
        self.resources = {k: v.rstrip("/") for k, v in resources.items()}
        self.participant = participant
        self.on_divergence = on_divergence
        self.admission_wait_s = admission_wait_s
        self.max_journaled_bytes = max_journaled_bytes
        self.runs: dict[Identity, RelayRun] = {}
        self._reopened = asyncio.Event()
        self._reopened.set()
        self.stats = tally(RELAY_STATS)

    # --- runs ------------------------------------------------------------------------------

    def open(self, ident: Identity, env: str, journal: list[RelayExchange]) -> RelayRun:
        run = self.runs[ident] = RelayRun(ident, env, journal, trace=current())  # in the run's span
        return run

    def close(self, ident: Identity) -> None:
        self.runs.pop(ident, None)

    def run_of(self, ident: Identity) -> RelayRun:
        """Only an attempt running here is relayed: the path's identity must name one (a process left
        over from a dead attempt, or anyone guessing ids, is refused and changes nothing)."""
        run = self.runs.get(ident)
        if run is None:
            why = f"{ident.rollout_id}/{ident.attempt} is not running on this relay"
            raise GymError(ErrorKind.STALE_ATTEMPT, why, rollout_id=ident.rollout_id, attempt=ident.attempt)
        return run

    # --- checkpoint hooks ----------------------------------------------------------------

    async def prepare(self, checkpoint_id: str) -> PrepareReport:
        """Prepare: nothing to write (the journal is the state); new live requests wait from now on
        (the runtime closed the gate before calling this)."""
        return PrepareReport()

    def release(self, checkpoint_id: str) -> None:
        self._reopened.set()

    async def _admitted(self) -> None:
        """Hold a new live request while a checkpoint (or a restore) holds this participant closed."""
        gate = self.participant.gate if self.participant is not None else None
        if gate is None or gate.state == "open":
            return
        self.stats.inc("live_held_for_checkpoint")
        give_up = time.monotonic() + self.admission_wait_s
        while gate.state == "closed":
            if time.monotonic() > give_up:
                raise GymError(ErrorKind.ADMISSION_CLOSED, f"{self.instance}: a checkpoint held it too long")
            self._reopened.clear()  # closed by a prepare or by a restore: either ends in a release
            with contextlib.suppress(TimeoutError):  # woken by the release, or looks again
                await asyncio.wait_for(self._reopened.wait(), 0.25)

    # --- one request ---------------------------------------------------------------------

    def upstream(self, target: str, path: str) -> tuple[str, str]:
        """The URL a request goes to, and the env it is a tool call of ("" for the model)."""
        if target == "model":
            return f"{self.model_url}{path}", ""
        base = self.resources.get(target)
        if base is None:
            raise GymError(ErrorKind.NOT_FOUND, f"no resources server for environment {target!r}")
        return f"{base}{path}", target

    async def handle(self, ident: Identity, req: Outgoing) -> Response:
        """Answer request ``req`` of ``ident`` from the journal, or live: a span in the run's trace
        (the agent's program carries no trace context), its outcome an attribute."""
        run = self.run_of(ident)
        attrs = {
            "rollcut.relay.route": req.route,
            "rollcut.relay.env": req.env or "model",
            **of_attempt(ident),
        }
        with span(f"rollcut.relay {req.method} {req.route}", SpanKind.SERVER, attrs, run.trace) as s:
            answer = await self._handle(run, req)
            s.set_attribute("rollcut.relay.outcome", "live" if run.live else "replayed")
            return answer

    async def _handle(self, run: RelayRun, req: Outgoing) -> Response:
        run.check()
        if not run.live:
            if run.cursor < len(run.journal):
                rec = run.journal[run.cursor]
                run.cursor += 1  # no await since reading it: requests take entries in arrival order
                same = rec.request_digest == req.digest and (rec.method, rec.route) == (req.method, req.route)
                if same and not rec.oversize:
                    return await self._replay(run, rec)
                await self._diverged(run, rec, req)
            else:
                run.live = True
        return await self._live(run, req)

    async def _replay(self, run: RelayRun, rec: RelayExchange) -> Response:
        await append_or_refuse(
            self.log,
            RelayReplayed(
                **envelope("agent", self.instance, run.ident),
                n=rec.n,
                request_digest=rec.request_digest,
                source_attempt=rec.attempt,
            ),
        )
        self.stats.inc("exchanges_replayed")
        headers = {"content-type": rec.content_type} if rec.content_type else None
        if rec.streamed:
            return StreamingResponse(replayed(rec.chunks), status_code=rec.status, headers=headers)
        return Response(rec.body, status_code=rec.status, headers=headers)

    async def _diverged(self, run: RelayRun, rec: RelayExchange, req: Outgoing) -> None:
        """Record the divergence, then stop the run (fresh dispatch) or go live from here."""
        self.stats.inc("divergences")
        if rec.oversize:
            why = f"request {rec.n}'s answer was over the journal's limit and was not kept"
        else:
            why = (
                f"request {rec.n} of {run.ident.rollout_id} differs from the journal: {req.method} "
                f"{req.route} (digest {req.digest[:12]}) where {rec.method} {rec.route} "
                f"({rec.request_digest[:12]}) was sent"
            )
        policy: DivergencePolicy = self.on_divergence
        if policy == "go_live":
            mode = await self._mode(run.env)
            if mode != "stateless":
                policy, why = "fresh_dispatch", f"{why}; go_live needs stateless tools, {run.env} is {mode}"
        await append_or_refuse(
            self.log,
            RelayDiverged(
                **envelope("agent", self.instance, run.ident),
                n=rec.n,
                method=req.method[:16],
                route=req.route[:4096],
                request_digest=req.digest,
                expected_route=rec.route,
                expected_digest=rec.request_digest,
                policy=policy,
                why=why[:1000],
            ),
        )
        if policy == "go_live":  # the rest of the journal is abandoned: this request is n, live
            run.abandon_from(rec.n)
            return
        run.stop(why)
        run.check()

    async def _mode(self, env: str) -> str:
        """The checkpoint mode the environment's resources server declares (``unknown`` if it cannot say)."""
        base = self.resources.get(env)
        try:
            answer = (await self.http.get(f"{base}/rollcut/stats", timeout=5)).json() if base else {}
        except (httpx.HTTPError, ValueError):
            return "unknown"
        return str(answer.get("mode", "unknown")) if isinstance(answer, dict) else "unknown"

    async def _send(self, ident: Identity, req: Outgoing) -> httpx.Response:
        """The request upstream, with the rollout's identity; a checkpoint's closed admission there is
        waited out (it was not admitted, so sending it again is safe)."""
        await self._admitted()
        headers = {**identity_headers(ident), **({"content-type": req.ctype} if req.ctype else {})}

        def send() -> Awaitable[httpx.Response]:
            request = self.http.build_request(req.method, req.url, content=req.body, headers=headers)
            return self.http.send(request, stream=True)

        return await sent_when_admitted(send, where=req.url, wait_s=self.admission_wait_s)

    async def _live(self, run: RelayRun, req: Outgoing) -> Response:
        """Upstream, then into the journal, in a task of its own: an agent that dies meanwhile (its
        connection gone) does not cut the exchange short, so what ran upstream is journaled, and an
        agent started again is answered from it instead of running it twice."""
        return await asyncio.shield(run.track(self._exchange(run, req)))

    async def _exchange(self, run: RelayRun, req: Outgoing) -> Response:
        try:
            resp = await self._send(run.ident, req)
        except httpx.HTTPError as exc:
            raise GymError(ErrorKind.HTTP_ERROR, f"{req.url}: {exc!r}", status=502) from exc
        out_type = resp.headers.get("content-type", "")
        headers = {"content-type": out_type} if out_type else None
        record = Pending(run, req, resp.status_code, out_type)
        if out_type.startswith("text/event-stream") and resp.status_code == 200:
            pipe: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
            run.track(self._pump(record, resp, pipe))
            return StreamingResponse(_drain(pipe), status_code=200, headers=headers)
        try:
            data = await resp.aread()
        finally:
            await resp.aclose()
        if resp.status_code == 409:
            refused(run, error_from_response(resp, where=req.url))
        if req.env and resp.status_code == 200:
            record.revision = revision_of(data, resp.headers.get(REVISION_HEADER))
        await self._journal(record, body=data)
        return Response(data, status_code=resp.status_code, headers=headers)

    async def _pump(
        self, record: Pending, resp: httpx.Response, pipe: asyncio.Queue[bytes | BaseException | None]
    ) -> None:
        """A stream's chunks to the agent as they come, except the last: it goes once the exchange is
        durable. Runs to the end whether or not the agent still reads."""
        chunks: list[bytes] = []
        held: bytes | None = None
        try:
            async for chunk in resp.aiter_raw():
                if held is not None:
                    pipe.put_nowait(held)
                held = chunk
                chunks.append(chunk)
            if not ends_in_error(chunks):  # a failure told inside the stream is not an answer to keep
                await self._journal(record, chunks=chunks, streamed=True)
        except BaseException as exc:  # the agent's stream breaks off, its end never sent
            pipe.put_nowait(exc)
            raise
        finally:
            await resp.aclose()
        if held is not None:
            pipe.put_nowait(held)
        pipe.put_nowait(None)

    async def _journal(
        self, p: Pending, *, body: bytes = b"", chunks: list[bytes] | None = None, streamed: bool = False
    ) -> None:
        if not journaled(p.status):
            return
        chunks = chunks or []
        size = len(body) + sum(len(c) for c in chunks)
        oversize = size > self.max_journaled_bytes
        n, p.run.next_n = p.run.next_n, p.run.next_n + 1  # no await between: numbers follow arrival here
        ev = RelayExchange(
            **envelope("agent", self.instance, p.run.ident),
            n=n,
            method=p.req.method,
            route=p.req.route,
            request_digest=p.req.digest,
            status=p.status,
            content_type=p.content_type[:256],
            body=b"" if oversize else body,
            chunks=[] if oversize else chunks,
            streamed=streamed,
            env=p.req.env,
            revision=p.revision,
            oversize=oversize,
        )
        try:
            await append_or_refuse(self.log, ev)
        except BaseException:
            if p.run.next_n == n + 1:  # not stored: the request keeps its number (unless one took the next)
                p.run.next_n = n
            raise
        p.run.kept(ev)
        self.stats.inc("exchanges_live")
        self.stats.inc("journaled_bytes", 0 if oversize else size)
        self.stats.inc("oversize", oversize)


async def _drain(pipe: asyncio.Queue[bytes | BaseException | None]) -> AsyncIterator[bytes]:
    """What :meth:`Relay._pump` passes on; a failure there breaks the agent's stream off."""
    while (item := await pipe.get()) is not None:
        if isinstance(item, BaseException):
            raise item
        yield item
