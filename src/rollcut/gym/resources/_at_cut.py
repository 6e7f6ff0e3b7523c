"""A session's state at a checkpoint's cut, made again by its environment's own codec.

The view folded the lineage at the cut with replay's own fold (``rollcut.replay.ResourceSession``):
the state it inherited (a snapshot, or the seed), the deltas since. What is left is the
environment's: read the state back and apply the deltas, or say why it cannot
(:class:`NotContinuable`), which starts the rollout over from its input; never a state made on a
guess.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..._errors import RollcutError
from ...replay import ResourceSession
from ._env import Environment

__all__ = ["NotContinuable", "settled", "state_at_cut"]


class NotContinuable(RollcutError):
    """This session cannot be rebuilt at the cut: the rollout needs a fresh dispatch."""


async def settled(value: Any) -> Any:
    """An environment's hook may be a coroutine (a sandbox copies, snapshots and restores files)."""
    return await value if inspect.isawaitable(value) else value


async def state_at_cut(env: Environment, at_cut: ResourceSession, rollout_id: str) -> Any:
    """The state ``at_cut`` describes, by ``env``'s codec; NotContinuable naming why not."""
    seed, base = at_cut.seed or {}, at_cut.state
    if env.mode == "restart_only":
        raise NotContinuable(f"{env.name} is restart_only: {rollout_id} needs a fresh dispatch")
    if env.mode == "stateless":
        return await settled(env.seed(seed))
    try:
        state = await settled(
            env.import_state(base, env.codec_version) if base is not None else env.seed(seed)
        )
        for m in at_cut.mutations:
            if m.delta is None:
                raise NotContinuable(
                    f"{env.name} mutation at revision {m.revision} has no delta and no snapshot follows it"
                )
            state = await settled(env.apply_delta(state, m.tool, m.arguments, m.delta))
    except NotContinuable:
        raise
    except Exception as exc:  # a codec that cannot read its own state: fail closed
        raise NotContinuable(f"{env.name} state of {rollout_id} does not restore: {exc!r}") from exc
    return state
