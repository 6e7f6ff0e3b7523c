"""The bus: event schema, codec, subjects, the fenced group-committed append,
ordered reads up to a cut, stream setup, and the embedded nats-server.

The event schema (``_events``) and its kind table (``_kinds``) are exported
whole: their own ``__all__`` is the list.
"""

from . import _nats  # noqa: F401, I001  (first: nats-py is imported there, without aiohttp)
from . import _events, _kinds
from ._auth import (
    PARTICIPANT_ROLES,
    ROLES,
    Credentials,
    Identity,
    identity_from_pipe,
    load_credentials,
    role_file,
    server_authorization,
)
from ._cluster import ClusterLayout, ClusterNode, EmbeddedCluster, embedded_nats, node_config
from ._codec import Codec, Upcaster, digest
from ._events import *  # noqa: F403  (the schema, whole)
from ._fence import Opening
from ._kinds import *  # noqa: F403  (the kind table, whole)
from ._log import EventLog, FenceState, ReadScope, StoredEvent, input_digest
from ._renewal import DEFAULT_IDENTITY_TTL_S, PipeRenewal, Renewals, Renewed, SelfRenewal, WorkerIdentities
from ._server import EmbeddedServer
from ._stream import BusConfig, login_options
from ._subjects import COLLECTOR_LANE, COORDINATOR_LANE, Subjects, check_token

__all__ = [
    *_events.__all__,
    *_kinds.__all__,
    "COLLECTOR_LANE",
    "COORDINATOR_LANE",
    "DEFAULT_IDENTITY_TTL_S",
    "PARTICIPANT_ROLES",
    "ROLES",
    "BusConfig",
    "ClusterLayout",
    "ClusterNode",
    "EmbeddedCluster",
    "embedded_nats",
    "node_config",
    "Codec",
    "Credentials",
    "EmbeddedServer",
    "EventLog",
    "Identity",
    "FenceState",
    "Opening",
    "PipeRenewal",
    "Renewals",
    "Renewed",
    "SelfRenewal",
    "WorkerIdentities",
    "ReadScope",
    "StoredEvent",
    "Subjects",
    "check_token",
    "Upcaster",
    "digest",
    "input_digest",
    "identity_from_pipe",
    "load_credentials",
    "login_options",
    "role_file",
    "server_authorization",
]
