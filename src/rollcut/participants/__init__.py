"""Participants and the coordinator: the checkpoint control plane.

The participant side (:class:`Participant`: capabilities, admission gate,
idempotent control endpoint, lease, hooks) and the coordinator side
(:class:`Coordinator`: discovery, prepare, seal, validation, publication;
:class:`Restorer`: plan, restore, resume) speak the records in ``_protocol``,
which is exported whole.
"""

from . import _protocol
from ._admission import AdmissionGate
from ._coordinator import Coordinator, InstanceInfo, new_checkpoint_id
from ._hooks import ParticipantHooks, ReleaseHook, RetireHook
from ._pauses import PAUSE_PHASES, PauseBreakdown
from ._protocol import *  # noqa: F403  (the control-plane records, whole)
from ._restore import RecoveryMode, RecoveryPlan, RecoveryResult, Restorer, plan_recovery
from ._result import CheckpointResult
from ._runtime import Participant, service_name

__all__ = [
    *_protocol.__all__,
    "PAUSE_PHASES",
    "AdmissionGate",
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
    "new_checkpoint_id",
    "plan_recovery",
    "service_name",
]
