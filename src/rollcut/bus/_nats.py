"""nats-py, imported first and without aiohttp (:mod:`rollcut._hidden`: its WebSocket transport,
which rollcut never uses, cost every process 0.16 s of CPU at start)."""

from __future__ import annotations

from .._hidden import aiohttp_hidden

with aiohttp_hidden():
    import nats.aio.client  # noqa: F401
