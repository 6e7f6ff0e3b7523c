"""What a collection's log says was done, done again, and kept across crashes.

The demo's side-by-side comparison and ``bench e2e`` count from the stream
itself, not from what a process remembers, so a recovery cannot flatter itself:
a completed model call whose request was generated again in a later attempt is
a regeneration, a tool mutation repeated at the same revision of the same
rollout's session is a re-execution, and whatever an attempt that continued
from a cut took over from its predecessors below that cut was kept.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import msgspec

from ..bus import (
    AttemptOpened,
    Event,
    EventLog,
    ModelCallCompleted,
    ModelCallContinued,
    ModelCallReused,
    RelayDiverged,
    RelayReplayed,
    ResourcesMutated,
    ResourcesSeeded,
    ResourcesVerified,
    ResultAccepted,
    RolloutDispatched,
    handlers_by_kind,
)

__all__ = ["DIVERGED_ON_REPLAY", "WorkByGroup", "WorkTally", "count_work", "count_work_by"]

_KEYS = (
    "generated",
    "reused",
    "mutations",
    "regenerated",
    "tokens_regenerated",
    "regenerated_continuing",
    "completed_tokens",
    "continued_tokens",
    "tool_calls_reexecuted",
    "model_calls_kept",
    "tokens_kept",
    "tool_calls_kept",
    "exchanges_replayed",
    "divergences",
)


class WorkTally:
    """:func:`count_work` one event at a time, for a reader that already walks the stream for
    something else (``rollcut report``): one pass, not two."""

    def __init__(self) -> None:
        self.out = dict.fromkeys(_KEYS, 0)
        self.calls: dict[str, list[tuple[int, int, str, int]]] = defaultdict(list)  # rid -> (a, seq, dig, n)
        self.tools: dict[str, list[tuple[int, int, tuple[int, str, bytes]]]] = defaultdict(list)
        self.cuts: dict[str, list[tuple[int, int]]] = defaultdict(list)  # rid -> (attempt, from_cut > 0)
        self.opened_from: dict[tuple[str, int], int] = {}

    def add(self, seq: int, ev: object) -> None:
        """Count one stored event (``seq``: its stream position); kinds that count nothing pass."""
        handler = _HANDLERS.get(type(ev))  # type: ignore[arg-type]
        if handler is not None:
            handler(self, seq, ev)

    def _completed(self, seq: int, ev: ModelCallCompleted) -> None:
        self.out["generated"] += 1
        self.out["completed_tokens"] += ev.receipt.count
        self.calls[ev.rollout_id].append((ev.attempt, seq, ev.request_digest, ev.receipt.count))

    def _continued(self, seq: int, ev: ModelCallContinued) -> None:
        self.out["continued_tokens"] += ev.token_boundary  # a durable prefix, not generated again

    def _mutated(self, seq: int, ev: ResourcesMutated) -> None:
        self.out["mutations"] += 1
        what = (ev.revision, ev.tool, msgspec.json.encode(ev.arguments, order="sorted"))
        self.tools[ev.rollout_id].append((ev.attempt, seq, what))

    def _opened(self, seq: int, ev: AttemptOpened) -> None:
        self.opened_from[(ev.rollout_id, ev.attempt)] = ev.from_cut
        if ev.from_cut > 0:
            self.cuts[ev.rollout_id].append((ev.attempt, ev.from_cut))

    def result(self) -> dict[str, int]:
        """The figures (see :func:`count_work`), once every event was added."""
        out = dict(self.out)
        for rid, made in self.calls.items():  # a completed call generated again, whatever the reason
            for attempt, seq, dig, n in made:
                if any(a < attempt and d == dig for a, _, d, _ in made):
                    out["regenerated"] += 1
                    out["tokens_regenerated"] += n
                    # in an attempt that continued from a cut, a regeneration is a loss; in a fresh
                    # dispatch (a restart-only environment, a refused continuation) it is what was asked
                    out["regenerated_continuing"] += self.opened_from.get((rid, attempt), 0) > 0
                elif _kept(self.cuts.get(rid, ()), attempt, seq):
                    out["model_calls_kept"] += 1
                    out["tokens_kept"] += n
        for rid, done in self.tools.items():
            for attempt, seq, what in done:
                if any(a < attempt and w == what for a, _, w in done):
                    out["tool_calls_reexecuted"] += 1
                elif _kept(self.cuts.get(rid, ()), attempt, seq):
                    out["tool_calls_kept"] += 1
        return out


async def count_work(log: EventLog) -> dict[str, int]:
    """What the log says happened: model calls generated and reused, tool mutations, and any completed
    model call generated twice (``regenerated``; ``regenerated_continuing``: in an attempt that
    continued from a cut, where it is a loss, not in a fresh dispatch, where it was asked for); the
    tokens of completed calls and the durable prefixes continuations started from; tool mutations
    made again (``tool_calls_reexecuted``); and what continuations kept: completed model calls (and
    their tokens) and tool mutations of earlier attempts at or below the cut a later attempt
    continued from; and an opaque agent's requests answered from its relay's journal
    (``exchanges_replayed``) and its replays that diverged (``divergences``)."""
    tally = WorkTally()
    async for s in log.read():
        tally.add(s.seq, s.event)
    return tally.result()


DIVERGED_ON_REPLAY = "answered differently on replay"
"""What a replayed server's divergence says (``gym.resources``' upstream environment, in the reason
of the fresh attempt it causes): how the log tells a divergence from any other restart."""


class WorkByGroup:
    """:class:`WorkTally` per group of rollouts (the group its input names: its environment, its
    server), with what a crash did to each group's rollouts: ``rollouts`` dispatched, ``rows``
    accepted, attempts ``continued`` from a cut or ``started_over`` from the input (of those, the
    ``divergences`` a replayed server's answer caused, added to an opaque agent's), the
    ``revisions_rebuilt`` by restores (a replayed server's calls given again), and verdicts
    ``verdicts_computed`` or ``verdicts_from_log``."""

    EXTRA = (
        "rollouts",
        "rows",
        "continued",
        "started_over",
        "divergences",
        "revisions_rebuilt",
        "verdicts_computed",
        "verdicts_from_log",
    )

    def __init__(self, group: Callable[[Any], str]) -> None:
        self.group = group
        self.of: dict[str, str] = {}  # rollout -> its group, from its dispatch
        self.tallies: dict[str, WorkTally] = {}
        self.extra: dict[str, Counter[str]] = {}

    def add(self, seq: int, ev: object) -> None:
        rid = getattr(ev, "rollout_id", None)
        if isinstance(ev, RolloutDispatched) and rid is not None:
            self.of[rid] = self.group(ev.input)
        name = self.of.get(rid) if rid is not None else None
        if name is None:
            return
        self.tallies.setdefault(name, WorkTally()).add(seq, ev)
        step = _EXTRA.get(type(ev))  # type: ignore[arg-type]
        if step is not None:
            self.extra.setdefault(name, Counter()).update(step(ev))

    def result(self) -> dict[str, dict[str, int]]:
        """Each group's :func:`count_work` figures and its crash figures (a key in both: their sum)."""
        out = {}
        for name, tally in sorted(self.tallies.items()):
            figures = {**dict.fromkeys(self.EXTRA, 0), **tally.result()}
            for key, n in self.extra.get(name, Counter()).items():
                figures[key] += n
            out[name] = figures
        return out


def _opened(ev: AttemptOpened) -> dict[str, int]:
    if ev.attempt < 2:
        return {}
    if ev.from_cut > 0:
        return {"continued": 1}
    return {"started_over": 1, "divergences": int(DIVERGED_ON_REPLAY in ev.reason)}


_EXTRA: dict[type[Event], Callable[[Any], dict[str, int]]] = handlers_by_kind(
    {
        RolloutDispatched: lambda ev: {"rollouts": 1},
        ResultAccepted: lambda ev: {"rows": 1},
        AttemptOpened: _opened,
        ResourcesSeeded: lambda ev: {"revisions_rebuilt": ev.revision if ev.attempt > 1 else 0},
        ResourcesVerified: lambda ev: {"verdicts_from_log" if ev.from_log else "verdicts_computed": 1},
    }
)
"""What each kind adds to its group's crash figures (:class:`WorkByGroup`)."""


async def count_work_by(
    log: EventLog, group: Callable[[Any], str]
) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """:func:`count_work`, and the same per group of rollouts (:class:`WorkByGroup`), in one pass."""
    whole, by = WorkTally(), WorkByGroup(group)
    async for s in log.read():
        whole.add(s.seq, s.event)
        by.add(s.seq, s.event)
    return whole.result(), by.result()


def _counter(key: str) -> Callable[[WorkTally, int, Any], None]:
    def count(tally: WorkTally, seq: int, ev: Any) -> None:
        tally.out[key] += 1

    return count


_HANDLERS: dict[type[Event], Callable[[WorkTally, int, Any], None]] = handlers_by_kind(
    {
        ModelCallCompleted: WorkTally._completed,
        ModelCallContinued: WorkTally._continued,
        ModelCallReused: _counter("reused"),
        ResourcesMutated: WorkTally._mutated,
        RelayReplayed: _counter("exchanges_replayed"),  # answered from the relay's journal
        RelayDiverged: _counter("divergences"),
        AttemptOpened: WorkTally._opened,
    }
)
"""What each counted kind does to the tally, by the kind table's struct (one dict look-up per event)."""


def _kept(continuations: list[tuple[int, int]] | tuple[()], attempt: int, seq: int) -> bool:
    """Whether a later attempt continued from a cut at or after ``seq``: what it took over."""
    return any(a > attempt and seq <= cut for a, cut in continuations)
