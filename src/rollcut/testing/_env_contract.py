"""The environment contract: what an environment that continues across a checkpoint must do.

A resources session is continued at a cut from what the log holds: an ``exported`` environment's
snapshot (``export_state`` read back by ``import_state``), an ``event_sourced`` one's seed and the
mutations since (each carrying its ``delta`` for ``apply_delta``, or, with ``state_in_events``, the
whole state). If any of those does not give back the state the live session had, the continued
rollout goes on from a state that never existed. This suite walks a few episodes of random calls of
the environment's own tools (arguments made from its ``parameters()`` schemas; a call the tool
refuses, as the server would, changes nothing) and checks, at every revision, that the export reads
back to the same state and that the log's fold of the episode is the live state (compared as the
environment exports them).

Subclass :class:`EnvironmentContract` in a test module (its name starting ``Test``) and implement
``make_environment``; override ``episode`` for tools whose arguments random values cannot reach.
Every hook may be a coroutine, as the server allows. Needs pytest (loaded only when asked for).
"""

from __future__ import annotations

import asyncio
import inspect
import random
from typing import Any, ClassVar

from .._errors import ConfigError
from ..gym.resources import Environment
from ..gym.wire import GymError

__all__ = ["EnvironmentContract"]

_REFUSED = (KeyError, TypeError, ValueError)  # what the server answers as the caller's 400
_WORDS = ("alpha", "beta", "gamma", "delta", "the counter", "x")


async def _settled(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _value(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A value of a JSON schema's shape (enums, scalars, arrays and objects; deeper than 4, null)."""
    if not isinstance(schema, dict) or depth > 4:
        return None
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if kind == "integer":
        return rng.randint(-3, 9)
    if kind == "number":
        return round(rng.uniform(-3, 9), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [_value(schema.get("items") or {}, rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: _value(v, rng, depth + 1) for k, v in sorted(props.items())}
    return rng.choice(_WORDS)


class EnvironmentContract:
    """Episodes of random tool calls; at every revision the export and the fold rebuild the state."""

    episodes: ClassVar[int] = 4
    calls_per_episode: ClassVar[int] = 10

    def make_environment(self) -> Environment:
        """The environment under test (its mode ``event_sourced`` or ``exported``)."""
        raise NotImplementedError

    def episode(self, env: Environment, rng: random.Random) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
        """One episode's seed arguments and tool calls: the environment's generated task's seed (or
        none), then random calls of its tools with arguments of their schemas' shapes."""
        try:
            seed = type(env).demo_task(rng).get("seed") or {}
        except ConfigError:
            seed = {}
        names, params = sorted(env.tools()), env.parameters()
        calls = [
            (name, {k: _value(v, rng) for k, v in params.get(name, {}).items()})
            for name in (rng.choices(names, k=self.calls_per_episode) if names else [])
        ]
        return seed, calls

    def test_at_every_revision_the_export_and_the_fold_rebuild_the_live_state(self) -> None:
        env = self.make_environment()
        assert env.mode in ("event_sourced", "exported"), f"{env.name} is {env.mode}: nothing to continue"
        revisions = [asyncio.run(self._walk(env, random.Random(n))) for n in range(self.episodes)]
        assert sum(revisions) > 0, f"{env.name}: no call of any episode was taken"

    async def _export(self, env: Environment, state: Any) -> bytes:
        blob = await _settled(env.export_state(state))
        assert isinstance(blob, bytes), f"{env.name}'s export is not bytes"
        return blob

    async def _walk(self, env: Environment, rng: random.Random) -> int:
        """One episode; how many calls it took."""
        seed, calls = self.episode(env, rng)
        state = await _settled(env.seed(seed))
        fold = await _settled(env.seed(seed))  # what a restore starts from: the seed, made again
        revision = 0
        for name, args in calls:
            draft = await _settled(env.copy(state))
            try:
                _, delta = await _settled(env.tools()[name](draft, args))
            except (*_REFUSED, GymError) as exc:
                if isinstance(exc, GymError) and exc.status >= 500:
                    raise
                env.close(draft)  # refused: the session is as it was
                continue
            env.close(state)
            state, revision = draft, revision + 1
            live = await self._export(env, state)
            back = await _settled(env.import_state(live, env.codec_version))
            assert await self._export(env, back) == live, f"{env.name}: export at revision {revision}"
            env.close(back)
            if env.mode == "event_sourced":
                if env.state_in_events:  # the mutation carries the whole state
                    env.close(fold)
                    fold = await _settled(env.import_state(live, env.codec_version))
                else:
                    assert delta is not None, f"{env.name}: {name} at revision {revision} logged no delta"
                    fold = await _settled(env.apply_delta(fold, name, args, delta))
                assert await self._export(env, fold) == live, f"{env.name}: fold at revision {revision}"
        env.close(state)
        env.close(fold)
        return revision
