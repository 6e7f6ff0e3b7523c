"""What each role may publish and subscribe to, as nats-server enforces it.

Roles and what each may publish (namespace ``ns``, prefix ``rc.ns``; ``<name>`` is
the identity's own name, i.e. the participant instance):

- admin: everything (operators and tools).
- coordinator: the coordinator lane ``mark.checkpoint``, fences (tombstone
  and open), ``ctl.>`` requests, the membership ``ping``, ``$SRV.>`` pings, the
  stream's JetStream API; it hears every instance's ``hello.*.*``.
- collector: fences (dispatch), ``ev.*.*.collector`` (result hand-off) and the
  collector lease lane.
- model, agent, resources, environment: ``ev.*.*.<its component>.<name>``, **its own**
  marker lane ``mark.<name>`` and **its own** ``hello.<component>.<name>``, plus
  direct gets; it subscribes to **its own** control subject
  ``ctl.<component>.<name>``, the ping, the lifecycle subjects and ``$SRV.>``,
  and may answer requests.

With per-instance identities (credentials schema 3) ``<name>`` is the
``{{name()}}`` template of the role's scoped signing key: the server fills in the
name of the identity that connected, so an instance can neither write another's
lane, nor answer a ping as another, nor hear another's control requests. With
schema 2's per-role users the name is a wildcard (one identity per role).
"""

from __future__ import annotations

from typing import Any

from .._errors import ConfigError
from ._subjects import COLLECTOR_LANE, COORDINATOR_LANE, PARTICIPANT_ROLES, Subjects

__all__ = ["PARTICIPANT_ROLES", "ROLES", "jwt_permissions", "permissions"]

ROLES = ("admin", "coordinator", "collector", *PARTICIPANT_ROLES)
"""Every role a credentials file holds a key for."""

NAME_TEMPLATE = "{{name()}}"


def permissions(role: str, s: Subjects, name: str = "*") -> dict[str, Any]:
    """``role``'s permissions in nats-server's config format; ``name`` is how the instance's own
    subjects are written (the ``{{name()}}`` template, or ``*`` for a per-role user)."""
    p = s.prefix
    # direct gets (any replica), the leader's message get (read-your-writes on a cluster), stream info
    js_read = [
        f"$JS.API.DIRECT.GET.{s.stream}",
        f"$JS.API.STREAM.MSG.GET.{s.stream}",
        f"$JS.API.STREAM.INFO.{s.stream}",
    ]
    inbox = ["_INBOX.>"]
    if role == "admin":
        return {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
    if role == "coordinator":
        return {
            "publish": {
                "allow": [
                    s.mark(COORDINATOR_LANE),
                    f"{p}.fence.*",
                    f"{p}.ctl.>",
                    s.ping(),
                    "$SRV.>",
                    *js_read,
                    f"$JS.API.STREAM.CREATE.{s.stream}",
                    f"$JS.API.STREAM.PURGE.{s.stream}",  # compaction
                    "$JS.API.INFO",
                ]
            },
            "subscribe": {"allow": [*inbox, s.hello("*", "*")]},
        }
    if role == "collector":
        return {
            "publish": {
                "allow": [
                    f"{p}.fence.*",
                    f"{p}.ev.*.*.collector",
                    s.mark(COLLECTOR_LANE),
                    *js_read,
                    "$JS.API.INFO",
                ]
            },
            "subscribe": {"allow": inbox},
        }
    if role in PARTICIPANT_ROLES:
        # a resources server's sandbox sessions and an opaque agent's sandbox (``--sandbox``) store
        # their trees in the namespace's object store
        blobs = _blob_store(s) if role in ("resources", "agent") else []
        return {
            "publish": {
                "allow": [
                    s.event("*", "*", role, name),  # an attempt's events, on its own subject only
                    s.mark(name),
                    s.hello(role, name),
                    *js_read,
                    "$JS.API.INFO",
                    *blobs,
                ],
                "deny": [s.mark(COORDINATOR_LANE), s.mark(COLLECTOR_LANE)],
            },
            # the rollout lifecycle (retirements) and hand-offs: a participant drops what it holds
            "subscribe": {
                "allow": [
                    *inbox,
                    s.control(f"{role}.{name}"),
                    s.ping(),
                    "$SRV.>",
                    f"{p}.fence.*",
                    f"{p}.ev.*.*.collector",
                ]
            },
            "allow_responses": True,
        }
    raise ConfigError(f"unknown role {role!r}")


def _blob_store(s: Subjects) -> list[str]:
    """The namespace's blob bucket and nothing else: its chunks and metadata, its stream's
    JetStream API (created on first use; an ordered consumer reads an object; a purge drops an
    overwritten object's old chunks), and flow-control replies. A blob read is checked against its
    name, so what a writer of the bucket could forge is a failed restore, never a wrong tree."""
    bucket, stream = s.blob_bucket, f"OBJ_{s.blob_bucket}"
    return [
        f"$O.{bucket}.>",
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.CREATE.{stream}",
        f"$JS.API.STREAM.UPDATE.{stream}",  # compressed on disk, set right after creation
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$JS.API.STREAM.PURGE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.DELETE.{stream}.>",
        "$JS.FC.>",
    ]


def jwt_permissions(role: str, s: Subjects) -> dict[str, Any]:
    """``role``'s permissions as a scoped signing key's template (the JWT field names), the
    instance's own subjects written with ``{{name()}}``."""
    conf = permissions(role, s, NAME_TEMPLATE)
    out: dict[str, Any] = {
        "pub": dict(conf["publish"]),
        "sub": dict(conf["subscribe"]),
        "subs": -1,
        "data": -1,
        "payload": -1,
    }
    if conf.get("allow_responses"):
        out["resp"] = {"max": 1, "ttl": 0}
    return out
