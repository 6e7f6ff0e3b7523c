"""Importing a library with aiohttp hidden from it, where aiohttp is only a transport rollcut
never uses.

nats-py (for a WebSocket transport) and openai (for an aiohttp HTTP client) import aiohttp at
their own import whenever it is installed (litellm, one of the extras, installs it): about
0.16 s of CPU each, a fifth of a Gym server's start, paid by ten processes a deployment and
again after every crash. rollcut reaches NATS over TCP and uses openai's types, never its
aiohttp client. Imported under :func:`aiohttp_hidden`, each records aiohttp as absent (and says
so itself if that transport is asked for); every later import sees aiohttp as it is."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

__all__ = ["aiohttp_hidden"]


@contextlib.contextmanager
def aiohttp_hidden() -> Iterator[None]:
    """Within: ``import aiohttp`` raises ImportError (unless it is loaded already: nothing to save)."""
    if "aiohttp" in sys.modules:
        yield
        return
    sys.modules["aiohttp"] = None  # type: ignore[assignment]  # how a module is marked unimportable
    try:
        yield
    finally:
        del sys.modules["aiohttp"]
