"""The control plane's wire records: JSON over NATS request-reply.

JSON (not msgpack) because these are few, small, and read by operators with
``nats req``; versioned msgspec structs like every other record.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from .._errors import CheckpointError, CheckpointFailedError, StaleCheckpointError
from ..bus import TokenReceipt

__all__ = [
    "CONTROL_SCHEMA_VERSION",
    "CallDisposition",
    "Capabilities",
    "CheckpointMode",
    "ControlErrorKind",
    "ControlReply",
    "ControlRequest",
    "Hello",
    "Op",
    "ParticipantState",
    "PrepareReport",
    "ProcessMode",
    "names_itself",
]

CONTROL_SCHEMA_VERSION = 1
"""The version of the control-plane records this rollcut speaks."""
Token = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,128}$")]

# event_sourced: state is a fold of its events; exported: must export a snapshot at prepare;
# stateless: holds nothing between requests; restart_only: cannot continue, fresh dispatch only.
CheckpointMode = Literal["event_sourced", "exported", "stateless", "restart_only"]
"""How a participant's state crosses a checkpoint."""
ProcessMode = Literal["single", "coordinated_workers", "unmanaged"]
"""Whether a participant is one process, one of coordinated workers, or unmanaged."""
Op = Literal["capabilities", "prepare", "commit", "restore", "resume", "abort"]
"""The control operations a participant answers."""


class ParticipantState(StrEnum):
    """Where a participant stands in the checkpoint protocol (a state, not an operation: ``prepare``
    is the operation, ``preparing`` and ``prepared`` the states it passes through; the coordinator's
    timed *phases* are a third thing, ``CheckpointResult.phases_ms``). Sent as ``phase`` on the
    wire, the field's name since schema 1."""

    IDLE = "idle"
    """No checkpoint is active."""
    PREPARING = "preparing"
    """Admission closed; accepted work drains and the prepare hook runs."""
    PREPARED = "prepared"
    """The prepare answered: paused until commit, resume or abort."""
    COMMITTED = "committed"
    """The checkpoint is published; paused until resume."""
    RESTORING = "restoring"
    """The restore hook runs."""
    RESTORED = "restored"
    """Sessions rebuilt at the cut; paused until resume."""
    RESUMED = "resumed"
    """Over: admission open again after a commit or a restore."""
    ABORTED = "aborted"
    """Over: the checkpoint was abandoned (or a prepare or restore failed)."""
    LEASE_EXPIRED = "lease_expired"
    """Over: the coordinator went silent past the deadline and its grace; admission reopened."""


WAITING = frozenset({ParticipantState.PREPARED, ParticipantState.COMMITTED, ParticipantState.RESTORED})
"""A checkpoint's states once the participant's hook has finished: it only waits to be released
(a commit is accepted in these, and a coordinator may end a dead checkpoint held in them)."""


class ControlErrorKind(StrEnum):
    """Why a participant refused a control operation (``ControlReply.error_kind``)."""

    STALE = "stale"
    """The request names a checkpoint that is over or not the active one: it can change nothing."""
    BUSY = "busy"
    """Another checkpoint is active on this participant."""
    DEADLINE = "deadline"
    """The deadline passed before the operation could finish."""
    FAILED = "failed"
    """The participant's hook failed."""
    BAD_REQUEST = "bad_request"
    """The request did not decode."""


class Capabilities(msgspec.Struct, frozen=True, kw_only=True):
    """What a participant declares: component, mode, workers, admission and protocol state."""

    schema_version: int = CONTROL_SCHEMA_VERSION
    component: str
    instance: str
    role: str = "primary"
    group: str = ""
    worker: int = 0
    workers: int = 1
    checkpoint_mode: CheckpointMode
    admission_states: list[str] = msgspec.field(default_factory=lambda: ["open", "closed"])
    process_mode: ProcessMode = "single"
    concurrency_contract: str = "serialized_per_session"
    event_schema_version: int = 1
    active_checkpoint: str | None = None
    state: ParticipantState = msgspec.field(default=ParticipantState.IDLE, name="phase")
    admission: str = "open"
    lease_expiries: int = 0


class CallDisposition(msgspec.Struct, frozen=True, kw_only=True):
    """Where one admitted model call stood when admission closed (generation cuts)."""

    call_id: str
    rollout_id: str
    attempt: int
    disposition: Literal["never_started", "completed", "prefix_cut", "failed", "excluded"]
    receipt: TokenReceipt | None = None
    token_boundary: int = 0


class PrepareReport(msgspec.Struct, frozen=True, kw_only=True):
    """What an exported participant's prepare hook returns."""

    unreproducible: list[str] = []
    calls: list[CallDisposition] | None = None  # None: this participant holds no model calls
    quarantined: dict[str, str] = {}
    """Rollouts whose state this participant could not export (rollout -> why): the checkpoint
    quarantines them, so a restore starts them over from their input, and publishes for the rest."""


class ControlRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One control operation: its checkpoint id and absolute deadline."""

    schema_version: int = CONTROL_SCHEMA_VERSION
    op: Op
    checkpoint_id: Token
    deadline: float  # absolute, seconds since the epoch
    cut: int | None = None
    detail: dict[str, Any] = {}


class ControlReply(msgspec.Struct, frozen=True, kw_only=True):
    """A participant's answer to one control operation."""

    schema_version: int = CONTROL_SCHEMA_VERSION
    ok: bool
    op: str
    checkpoint_id: str
    instance: str
    state: ParticipantState = msgspec.field(default=ParticipantState.IDLE, name="phase")
    last_seq: int = 0
    unreproducible: list[str] = []
    error: str = ""
    error_kind: str = ""  # a ControlErrorKind when not ok (a string on the wire: older peers decode it)
    capabilities: Capabilities | None = None
    calls: list[CallDisposition] | None = None
    started_seq: int = 0  # the stream's end when this process started: older calls are not its to report
    phases_ms: dict[str, float] = {}
    """Where a prepare's time went inside the participant (``drain``: accepted work finishing,
    ``export``: its hook), so the coordinator can tell them from the wire and a busy loop."""
    quarantined: Annotated[dict[Token, Annotated[str, Meta(max_length=300)]], Meta(max_length=10_000)] = {}
    """PrepareReport.quarantined, as the prepare's answer carries it (bounded: a reply is input)."""
    active_checkpoint: Annotated[str, Meta(max_length=256)] | None = None
    """The checkpoint active on the participant as it answered (as in :class:`Capabilities`): on a
    ``busy`` refusal, the one in the way, which a coordinator may end once the lane shows it dead."""

    def refusal(self) -> CheckpointError:
        """The error this refused reply stands for, carrying its checkpoint and participant."""
        cls = StaleCheckpointError if self.error_kind == ControlErrorKind.STALE else CheckpointFailedError
        return cls(
            f"{self.instance} refused {self.op} ({self.error_kind or 'unknown'}): {self.error}",
            checkpoint_id=self.checkpoint_id,
            participant=self.instance,
        )


class Hello(msgspec.Struct, frozen=True, kw_only=True):
    """An instance's announcement, or its answer to a membership ping (``round``), published on
    its own ``hello.<component>.<instance>`` subject. It names neither: where it was published
    says who sent it, and only that instance's identity may publish there."""

    schema_version: int = CONTROL_SCHEMA_VERSION
    round: Annotated[str, Meta(max_length=64)] = ""  # "" = an announcement
    process: Annotated[str, Meta(max_length=64)]  # one per process: two processes of one name clash
    group: Token
    worker: Annotated[int, Meta(ge=0, le=65_535)] = 0
    workers: Annotated[int, Meta(ge=1, le=65_536)] = 1
    mode: CheckpointMode


def names_itself(instance: str, group: str, worker: int, workers: int) -> bool:
    """Whether ``instance`` is the name of worker ``worker`` of ``workers`` in ``group``:
    ``<group>-w<worker>``, or the group itself when it is alone. A participant is refused a name
    that is not, and membership ignores an answer whose group and worker do not name its sender
    (so no instance speaks for another's group)."""
    if not 0 <= worker < workers:
        return False
    return instance == f"{group}-w{worker}" or (instance == group and workers == 1)
