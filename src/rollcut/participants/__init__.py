"""Participants and the coordinator: the checkpoint control plane.

The participant side (:class:`Participant`: capabilities, admission gate,
idempotent control endpoint, lease) and the coordinator side
(:class:`Coordinator`: discovery, prepare, seal, validation, publication)
speak the records in ``_protocol``.
"""

from ._admission import AdmissionGate
from ._coordinator import CheckpointResult, Coordinator, InstanceInfo, new_checkpoint_id
from ._hooks import ParticipantHooks, ReleaseHook, RetireHook
from ._protocol import (
    CallDisposition,
    Capabilities,
    CheckpointMode,
    ControlErrorKind,
    ControlReply,
    ControlRequest,
    ExportReport,
    ProcessMode,
)
from ._restore import RecoveryMode, RecoveryPlan, RecoveryResult, Restorer, plan_recovery
from ._runtime import Participant, service_name

__all__ = [
    "AdmissionGate",
    "CallDisposition",
    "Capabilities",
    "CheckpointMode",
    "CheckpointResult",
    "ControlErrorKind",
    "ControlReply",
    "ControlRequest",
    "Coordinator",
    "ExportReport",
    "InstanceInfo",
    "Participant",
    "ParticipantHooks",
    "ProcessMode",
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
