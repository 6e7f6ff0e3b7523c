"""The subject map: where each event lives, and the reverse.

    rc.<ns>.ev.<rollout_id>.<attempt>.<role>.<inst> events of one attempt by one instance of a Gym
                                                    server role (the writer: docs/security.md)
    rc.<ns>.ev.<rollout_id>.<attempt>.collector     the collector's events of one attempt
    rc.<ns>.ev.<rollout_id>.<attempt>.<component>   (written before: any component, writer unknown)
    rc.<ns>.fence.<rollout_id>                      attempt lifecycle (dispatch, open, tombstone)
    rc.<ns>.mark.checkpoint                         the coordinator lane: prepare, seal, commit, abort
    rc.<ns>.mark.<instance>                         a participant's own markers (replies, lease expiry)
    rc.<ns>.ctl.>                                   control request/reply (core NATS, not stored)
    rc.<ns>.ping, rc.<ns>.hello.<component>.<inst>  membership: the ping, each instance's answer

Markers live outside ``ctl`` on purpose: the stream must capture them, and a
stream that captured ``ctl`` would also capture (and answer!) every control
request. All coordinator markers share one lane so that each can be appended
with a compare-and-set on the lane's last sequence: that is what makes two
concurrent checkpoints impossible (see participants/_coordinator.py).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .._errors import ConfigError
from ._events import CheckpointEvent, CollectorLease, Event, RolloutEvent
from ._kinds import Lane, spec_of

__all__ = [
    "COLLECTOR_LANE",
    "COORDINATOR_LANE",
    "PARTICIPANT_ROLES",
    "ParsedSubject",
    "Subjects",
    "check_token",
]

PARTICIPANT_ROLES = ("model", "agent", "resources", "environment")
"""The roles of Gym servers: each instance of one has its own identity and subjects, and writes an
attempt's events on a subject that names it (the role's permissions let it write no other)."""

COORDINATOR_LANE = "checkpoint"
"""The marker lane the coordinator's checkpoint markers go to."""
COLLECTOR_LANE = "collector"
"""The marker lane of the namespace's collector lease; no participant instance may be named so."""

_PARSED_MAX = 1 << 16
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def check_token(value: str, what: str) -> str:
    """``value``, if it may become a subject token (1-128 of ``[A-Za-z0-9_-]``); else a ConfigError."""
    if not isinstance(value, str) or not _TOKEN.match(value):
        raise ConfigError(f"{what} {value!r} is not a valid token: use 1-128 of A-Z a-z 0-9 _ -")
    return value


class ParsedSubject(NamedTuple):
    family: str  # "ev" | "fence" | "mark"
    rollout_id: str | None
    attempt: int | None
    component: str | None
    lane: str | None
    instance: str | None = None
    """On an event subject of a Gym server role: the instance whose subject it is (the writer, as
    far as the server's permissions say); None on a subject written before, or the collector's."""


class Subjects:
    """Subjects and the stream name for one namespace."""

    def __init__(self, namespace: str) -> None:
        self.namespace = check_token(namespace, "namespace")
        self.prefix = f"rc.{namespace}"
        self.stream = f"RC_{namespace}"
        # the namespace's JetStream object store of content-addressed blobs (sandbox trees)
        self.blob_bucket = f"rc_{namespace}_blobs"
        self._parsed: dict[str, ParsedSubject] = {}
        self.stream_subjects = [
            f"{self.prefix}.ev.>",
            f"{self.prefix}.fence.*",
            f"{self.prefix}.mark.*",
        ]

    def event(self, rollout_id: str, attempt: int | str, component: str, instance: str | None = None) -> str:
        """An attempt's events by ``component``; by one instance of it, with ``instance`` (how every
        Gym server role writes), or any instance with ``instance="*"`` (a filter)."""
        base = f"{self.prefix}.ev.{rollout_id}.{attempt}.{component}"
        return base if instance is None else f"{base}.{instance}"

    def fence(self, rollout_id: str) -> str:
        return f"{self.prefix}.fence.{rollout_id}"

    def mark(self, lane: str = COORDINATOR_LANE) -> str:
        return f"{self.prefix}.mark.{lane}"

    def control(self, suffix: str) -> str:
        return f"{self.prefix}.ctl.{suffix}"

    def hello(self, component: str, instance: str) -> str:
        """Where instance ``instance`` of ``component`` announces itself and answers a membership
        ping (core NATS, never stored). The instance is a subject token, so a per-instance identity
        may publish here and nowhere else: who answered is where the answer came from."""
        return f"{self.prefix}.hello.{component}.{instance}"

    def ping(self) -> str:
        """Where a coordinator asks every live participant to answer on its own hello subject."""
        return f"{self.prefix}.ping"

    def attempt_filter(self, rollout_id: str, attempt: int) -> str:
        return f"{self.prefix}.ev.{rollout_id}.{attempt}.>"

    def component_filters(self, component: str, rollout_id: str = "*") -> list[str]:
        """Every subject ``component``'s events of ``rollout_id`` (any attempt) may be stored on: a
        Gym server role's on its writers' own subjects, then, for every component, the shape
        written before (a log from an older rollcut)."""
        c = check_token(component, "component")
        writers = [self.event(rollout_id, "*", c, "*")] if c in PARTICIPANT_ROLES else []
        return [*writers, self.event(rollout_id, "*", c)]

    def rollout_filters(self, rollout_id: str) -> list[str]:
        return [self.fence(rollout_id), f"{self.prefix}.ev.{rollout_id}.>"]

    def for_event(self, event: Event) -> str:
        """The subject an event is appended to; lifecycle events go to the fence."""
        if isinstance(event, RolloutEvent):
            if spec_of(event).lane is Lane.FENCE:
                return self.fence(event.rollout_id)
            instance = (
                check_token(event.instance, "instance") if event.component in PARTICIPANT_ROLES else None
            )
            return self.event(event.rollout_id, event.attempt, event.component, instance)
        if isinstance(event, CollectorLease):
            return self.mark(COLLECTOR_LANE)
        if isinstance(event, CheckpointEvent):
            return self.mark(COORDINATOR_LANE if event.component == "coordinator" else event.instance)
        raise ConfigError(f"{type(event).__name__} has no subject")

    def parse(self, subject: str) -> ParsedSubject:
        """What a stored subject names; a ConfigError if it is not one of this namespace's.

        Remembered: a replay asks for the same few subjects of every rollout once per event
        (the cache is dropped whole when it reaches ``_PARSED_MAX`` entries).
        """
        hit = self._parsed.get(subject)
        if hit is not None:
            return hit
        parsed = self._parse(subject)
        if len(self._parsed) >= _PARSED_MAX:
            self._parsed.clear()
        self._parsed[subject] = parsed
        return parsed

    def _parse(self, subject: str) -> ParsedSubject:
        parts = subject.split(".")
        if len(parts) >= 4 and parts[0] == "rc" and parts[1] == self.namespace:
            fam = parts[2]
            if fam == "ev" and len(parts) == 6 and parts[4].isdigit():
                return ParsedSubject("ev", parts[3], int(parts[4]), parts[5], None)
            if fam == "ev" and len(parts) == 7 and parts[4].isdigit() and parts[5] in PARTICIPANT_ROLES:
                return ParsedSubject("ev", parts[3], int(parts[4]), parts[5], None, parts[6])
            if fam == "fence" and len(parts) == 4:
                return ParsedSubject("fence", parts[3], None, None, None)
            if fam == "mark" and len(parts) == 4:
                return ParsedSubject("mark", None, None, None, parts[3])
        raise ConfigError(f"subject {subject!r} is not a rollcut subject of namespace {self.namespace!r}")


def is_fence_kind(event: Event) -> bool:
    return spec_of(event).lane is Lane.FENCE
