"""NeMo Gym's own agents as an agent kind (``rollcut serve agent nemo-gym NAME``).

The agent (``simple_agent``, ``gymnasium_agent`` ... from the installed wheel) runs unmodified as a
child process, configured to reach rollcut's model server and resources server through this process,
with NeMo Gym's observability on: every call it makes carries its rollout's
``/ng-rollout/<id>[-a<n>]`` prefix, which rollcut's servers read as the attempt. rollcut cannot see inside
its loop, so it is driven as NeMo Gym drives it: ``/run`` with the row, and the attempt as
``_ng_rollout_id`` and ``_ng_attempt_index``. A continued attempt runs ``/run`` again on the same
row: every model call the lineage completed below the cut is answered from the log when the request
is the same (``model.reused``), every tool call from the resources server's journal in order, until
the history runs out; then it is live. A request that differs from the history restarts the rollout
from its input (``replay_mismatch``), named.

Why through this process: rollcut's servers refuse a call at once while a checkpoint holds
admission (``503 admission_closed``, ``Retry-After``: a caller that hangs cannot tell a slow
checkpoint from a dead server), and rollcut's own agents send it again; NeMo Gym's agents do not,
and would fail the attempt. NeMo Gym names a server by host and port only, so each of the two
gets a forwarder of its own on a loopback port here, which sends a refused call again for up to
``ADMISSION_WAIT_S`` and passes everything else through as it is.
"""

from __future__ import annotations

import asyncio
import atexit
import re
import socket
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from ..._errors import ConfigError
from ...bus import EventLog
from ...participants import Participant
from .._agents import Make
from .._attempts import FreshDispatchNeeded, sent_when_admitted
from .._client import gym_client
from .._http import gym_app, identity_of, json_body
from .._options import AgentServe
from ..resources import NemoGymServer
from ..wire import ErrorKind, GymError, error_from_response, ng_path_id

__all__ = ["nemo_gym"]

ADMISSION_WAIT_S = 120.0
"""How long a forwarded call refused by a checkpoint is sent again (rollcut's agents wait as long)."""
_PASSED = ("content-type", "cookie", "accept")
_NG_PATH = re.compile(r"ng-rollout/([A-Za-z0-9_.-]+)/")


def _forwarder(target: str, http: httpx.AsyncClient, refused: dict[str, GymError]) -> FastAPI:
    """Every route of ``target``, sent again while a checkpoint refuses it, else answered as it is.
    A refusal the rollout cannot continue past (``not_continuable``, ``replay_mismatch``) is kept in
    ``refused`` by the attempt's NeMo Gym id: NeMo Gym's agent reports it only as its own 500."""
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE"])
    async def forward(path: str, request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() in _PASSED}
        url = f"{target}/{path}" + (f"?{request.url.query}" if request.url.query else "")

        async def send() -> httpx.Response:
            return await http.request(request.method, url, content=body, headers=headers)

        resp = await sent_when_admitted(send, where=url, wait_s=ADMISSION_WAIT_S)
        if resp.status_code >= 400 and (named := _NG_PATH.match(path)):
            await resp.aread()
            err = error_from_response(resp, where=url)
            if err.needs_fresh_dispatch:
                refused[named.group(1)] = err
        out = Response(await resp.aread(), resp.status_code, media_type=resp.headers.get("content-type"))
        for cookie in resp.headers.get_list("set-cookie"):
            out.headers.append("set-cookie", cookie)
        return out

    return app


def _served(app: FastAPI, keep: set[asyncio.Task[None]]) -> str:
    """``app`` on a free loopback port of its own, in this worker's loop; its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    keep.add(asyncio.get_running_loop().create_task(server.serve(sockets=[sock])))
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


def nemo_gym(opts: AgentServe, own_url: str) -> Make:
    """NeMo Gym's agent ``opts.server``, unmodified, between rollcut's model and resources servers."""
    if not opts.server:
        raise ConfigError("nemo-gym needs the agent's name: rollcut serve agent nemo-gym NAME")
    if len(opts.resources) != 1:
        raise ConfigError("a NeMo Gym agent has one resources server: give --resources NAME=URL once")
    ((name, url),) = opts.resources.items()

    def make(log: EventLog, instance: str, participant: Participant) -> tuple[FastAPI, Any]:
        # started here, in the worker (the factory itself is also called to check the options)
        forwarding = gym_client(600)
        serving: set[asyncio.Task[None]] = set()
        refused: dict[str, GymError] = {}

        def forwarder(to: str) -> str:
            return _served(_forwarder(to.rstrip("/"), forwarding, refused), serving)

        peers = {"resources": {"name": name, "url": forwarder(url)}, "model": forwarder(opts.model)}
        child = NemoGymServer(opts.server, kind="responses_api_agents", peers=peers)  # its log unnamed
        atexit.register(child.kill)  # and its lifeline, should this process be killed
        agent_url = child.start().url
        http = gym_client(600)
        app = gym_app(f"rollcut agent: NeMo Gym's {opts.server}", max_body_bytes=opts.max_body_bytes)
        app.state.forwarders = serving  # held for as long as the app serves

        @app.post("/run")
        async def run(request: Request) -> Any:
            body = await json_body(request)
            ident = identity_of(request, body)
            row = {**body, "_ng_rollout_id": ident.rollout_id, "_ng_attempt_index": ident.attempt - 1}
            try:
                resp = await http.post(f"{agent_url}/run", json=row)
            except httpx.HTTPError as exc:
                raise GymError(
                    ErrorKind.AGENT_FAILED, f"NeMo Gym's {opts.server} did not answer /run: {exc!r}"
                ) from exc
            finally:
                why = refused.pop(ng_path_id(ident), None)
            if why is not None:  # the history could not be given again: start over, saying why
                raise FreshDispatchNeeded(f"NeMo Gym's {opts.server}: {why}")
            if not resp.is_success:
                raise error_from_response(resp, where=f"NeMo Gym's {opts.server} /run")
            return JSONResponse(resp.json())

        @app.get("/healthz")
        async def healthz() -> dict[str, str]:
            return {"status": "ok"}

        return app, None

    return make
