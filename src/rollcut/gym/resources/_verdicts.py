"""A session's verdict: computed once per rollout, journaled before it goes back.

``/verify`` asks the environment for a reward; a continued attempt that asks again at the revision
its lineage was verified at below the cut, with the same request (by its digest), is given the
journaled verdict (``resources.verified``) instead of a second one: an LLM judge's verdict can
differ when asked twice, and costs a model call. The verdict is journaled before it is answered,
so a crash between the two leaves it on the log. A verdict journaled after the cut is not used:
the continuation holds the session as it was at the cut, and makes the calls after it again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from ...bus import ResourcesVerified, digest
from ...participants import InFlight
from .._writes import Envelope
from ._env import Environment

if TYPE_CHECKING:
    from ._service import Session

__all__ = ["Verdicts"]


class Verdicts:
    """The verifications of one resources server: how many run now (a ``wait`` environment's prepare
    waits until none does), and each one's verdict, from the journal or computed."""

    def __init__(self, env: Environment, append: Callable[[Any], Awaitable[int]]) -> None:
        self.env, self._append = env, append
        self.running = InFlight()

    async def verdict(
        self,
        s: Session,
        args: dict[str, Any],
        envelope: Envelope,
        compute: Callable[[], Awaitable[dict[str, Any]]],
    ) -> tuple[dict[str, Any], bool]:
        """The session's verdict and whether it came from the journal (else ``compute`` made it);
        journaled either way."""
        with self.running.hold():
            async with s.lock:
                return await self._verdict(s, msgspec.json.encode(args, order="sorted"), envelope, compute)

    async def _verdict(
        self, s: Session, args: bytes, envelope: Envelope, compute: Callable[[], Awaitable[dict[str, Any]]]
    ) -> tuple[dict[str, Any], bool]:
        request = digest(args)
        old = s.journaled_verdict
        if (
            old is not None
            and old.revision == s.revision
            and old.request == request
            and isinstance(old.verdict, dict)
        ):
            out, from_log = old.verdict, True
        else:
            out, from_log = await compute(), False
        await self._append(
            ResourcesVerified(
                **envelope,
                session=self.env.name,
                revision=s.revision,
                request=request,
                verdict=out,
                from_log=from_log,
            )
        )
        return out, from_log
