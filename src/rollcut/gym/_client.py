"""How Gym servers call each other: one client shape (no cookie jar, TCP_NODELAY, traced), and the
deep health check of a server whose episodes need others up."""

from __future__ import annotations

import http.cookiejar
import socket
from typing import Any

import httpx
from fastapi.responses import JSONResponse

from .._tracing import traced

__all__ = ["deep_health", "gym_client"]


class _NoCookies(http.cookiejar.CookieJar):
    """Keeps nothing: one run's session cookie must never ride on another run's call."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None


def gym_client(timeout: float, *, max_connections: int = 1000) -> httpx.AsyncClient:
    """The client Gym servers call each other with: TCP_NODELAY, and no cookie jar (a session cookie
    is passed along explicitly, per run, as NeMo Gym's agents do)."""
    transport = httpx.AsyncHTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    return httpx.AsyncClient(
        timeout=timeout,
        transport=transport,
        limits=httpx.Limits(max_connections=max_connections),
        cookies=httpx.Cookies(_NoCookies()),
        event_hooks={"request": [traced]},
    )


async def deep_health(http: httpx.AsyncClient, urls: list[str]) -> Any:
    """The ``/healthz`` of a server that calls others (an agent): ok only if each of them answers, so a
    framework waiting on it after a crash waits for what an episode needs, not just this process."""
    down = []
    for url in urls:
        try:
            if (await http.get(f"{url.rstrip('/')}/healthz", timeout=2)).status_code != 200:
                down.append(url)
        except httpx.HTTPError:
            down.append(url)
    if down:
        return JSONResponse({"status": "unavailable", "down": down}, status_code=503)
    return {"status": "ok"}
