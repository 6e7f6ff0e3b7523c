"""Participants and the coordinator: the checkpoint control plane.

The participant side (:class:`Participant`: capabilities, admission gate,
idempotent control endpoint, lease, hooks) and the coordinator side
(:class:`Coordinator`: discovery, prepare, seal, validation, publication;
:class:`Restorer`: plan, restore, resume) speak the records in ``_protocol``,
which is exported whole.

The coordinator side loads on first use (PEP 562): a Gym server is a participant only, and
does not pay for the coordinator, the restorer, the ledger and the replay they import (about a
tenth of a second of CPU at every server's start; a test deployment starts ten).
"""

from __future__ import annotations

import typing as _typing

from .._lazy import lazy_names as _lazy_names
from . import _protocol
from ._admission import AdmissionGate, InFlight
from ._hooks import ParticipantHooks, ReleaseHook, RetireHook, SupersedeHook
from ._protocol import *  # noqa: F403  (the control-plane records, whole)
from ._runtime import Participant, service_name

if _typing.TYPE_CHECKING:
    from ._coordinator import Coordinator, InstanceInfo, new_checkpoint_id
    from ._pauses import PAUSE_PHASES, PauseBreakdown
    from ._restore import RecoveryMode, RecoveryPlan, RecoveryResult, Restorer, plan_recovery
    from ._result import CheckpointResult

_HOME = {
    "_coordinator": ("Coordinator", "InstanceInfo", "new_checkpoint_id"),
    "_pauses": ("PAUSE_PHASES", "PauseBreakdown"),
    "_restore": ("RecoveryMode", "RecoveryPlan", "RecoveryResult", "Restorer", "plan_recovery"),
    "_result": ("CheckpointResult",),
}


__getattr__ = _lazy_names(__name__, _HOME, globals())


__all__ = [
    *_protocol.__all__,
    "PAUSE_PHASES",
    "AdmissionGate",
    "InFlight",
    "CheckpointResult",
    "Coordinator",
    "InstanceInfo",
    "Participant",
    "ParticipantHooks",
    "PauseBreakdown",
    "RecoveryMode",
    "RecoveryPlan",
    "RecoveryResult",
    "ReleaseHook",
    "Restorer",
    "RetireHook",
    "SupersedeHook",
    "new_checkpoint_id",
    "plan_recovery",
    "service_name",
]
