"""Authority comes from where a record is stored, not from what it says.

The NATS server decides who may publish on which subject (per-role
permissions, docs/security.md), so the subject a record was stored on is the
one fact about its writer a reader can trust. A record's body must agree with
it, by the kind table (``_kinds.KINDS``):

- the kind's lane is the subject's family (``ev``, ``fence``, ``mark``);
- on ``ev.<rollout>.<attempt>.<component>[.<instance>]``: the component is one of the
  kind's writers, and the body names the same rollout, attempt and component, and the same
  instance where the subject names one (a Gym server role's events name their writer; the
  server lets an instance write on its own subject only);
- on ``fence.<rollout>``: a lifecycle kind of that rollout (only the
  collector and coordinator roles may publish there);
- on ``mark.checkpoint``: a coordinator marker written as the coordinator;
  on ``mark.collector``: the collector's lease, and nothing else;
  on ``mark.<instance>``: that instance's own participant marker.

A record that disagrees is quarantined like a corrupt frame: its rollout (if
the subject names one) is marked corrupt, nothing else trusts it. Writers are
checked by the same rule before anything is sent.
"""

from __future__ import annotations

from .._errors import ConfigError
from ._events import CheckpointEvent, CollectorLease, Event, RolloutEvent
from ._kinds import KindSpec, Lane, spec_of
from ._subjects import COLLECTOR_LANE, COORDINATOR_LANE, ParsedSubject, Subjects

__all__ = ["authority_error"]

_FAMILY = {"ev": Lane.EVENTS, "fence": Lane.FENCE, "mark": Lane.MARKER}


def authority_error(subjects: Subjects, subject: str, event: Event) -> str | None:
    """Why ``event`` may not be stored on ``subject`` (None when it may)."""
    try:
        parsed = subjects.parse(subject)
    except ConfigError as exc:
        return str(exc)
    spec = spec_of(event)
    if (  # the bulk of any log, agreeing in full: checked here with no tuple made or name built
        spec.lane is Lane.EVENTS
        and parsed.family == "ev"
        and isinstance(event, RolloutEvent)
        and event.rollout_id == parsed.rollout_id
        and event.attempt == parsed.attempt
        and event.component == parsed.component
        and (parsed.instance is None or event.instance == parsed.instance)
        and parsed.component in spec.writers
    ):
        return None
    return _disagreement(parsed, spec, event)


def _disagreement(parsed: ParsedSubject, spec: KindSpec, event: Event) -> str | None:
    """The rule a record broke, in words (None: it broke none)."""
    if _FAMILY.get(parsed.family) is not spec.lane:
        return f"a {spec.kind} record does not belong on a {parsed.family} subject"
    if isinstance(event, RolloutEvent):
        if event.rollout_id != parsed.rollout_id:
            return f"the body names rollout {event.rollout_id!r}, the subject {parsed.rollout_id!r}"
        if spec.lane is Lane.EVENTS:
            if parsed.component not in spec.writers:
                return (
                    f"{parsed.component} may not write {spec.kind} (only {', '.join(sorted(spec.writers))})"
                )
            if (event.attempt, event.component) != (parsed.attempt, parsed.component):
                return (
                    f"the body says {event.component} of attempt {event.attempt}, "
                    f"the subject {parsed.component} of attempt {parsed.attempt}"
                )
            if parsed.instance is not None and event.instance != parsed.instance:
                return (
                    f"the body says it was written by {event.instance!r}, the subject by {parsed.instance!r}"
                )
        elif event.component not in spec.writers:
            return f"{event.component} may not write {spec.kind}"
        return None
    if isinstance(event, CollectorLease):
        if parsed.lane != COLLECTOR_LANE or event.component != "collector":
            return f"a collector lease is written by the collector on its lane, not on {parsed.lane}"
        return None
    if parsed.lane == COLLECTOR_LANE:
        return f"{spec.kind} does not belong on the collector lease lane"
    if isinstance(event, CheckpointEvent):
        if parsed.lane == COORDINATOR_LANE:
            if event.component != "coordinator" or "coordinator" not in spec.writers:
                return f"only the coordinator writes {spec.kind} on its lane"
        elif event.instance != parsed.lane or event.component == "coordinator":
            return f"{event.instance} wrote {spec.kind} on the lane of {parsed.lane}"
        return None
    return f"{spec.kind} has no lane"  # pragma: no cover - every kind is a rollout or checkpoint event
