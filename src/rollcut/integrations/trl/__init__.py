"""rollcut under TRL (the ``trl`` extra): a ``rollout_func`` for ``GRPOTrainer`` whose rollouts are
rollcut collections, and a policy the trainer and the engine load from the same weights.

The contract this implements is ``docs/trainer-integration.md``.
"""

from ._local import LocalLoop, local_loop
from ._policy import (
    POLICY_SHAPE,
    PolicyFiles,
    PolicyManifest,
    from_gguf_layout,
    load_policy,
    new_policy,
    to_gguf_layout,
    write_policy,
)
from ._rollout import (
    Deployment,
    RolloutFunction,
    SequenceError,
    StepRecord,
    reward_from_rollcut,
    sequence_of,
)
from ._run import LETTERS_PROMPT, train_letters
from ._sync import ENGINE_FLAGS, EngineSync, LogprobCheck, LogprobMismatchError, policy_engine

__all__ = [
    "ENGINE_FLAGS",
    "LETTERS_PROMPT",
    "POLICY_SHAPE",
    "Deployment",
    "EngineSync",
    "LocalLoop",
    "LogprobCheck",
    "LogprobMismatchError",
    "PolicyFiles",
    "PolicyManifest",
    "RolloutFunction",
    "SequenceError",
    "StepRecord",
    "from_gguf_layout",
    "load_policy",
    "local_loop",
    "new_policy",
    "policy_engine",
    "reward_from_rollcut",
    "sequence_of",
    "to_gguf_layout",
    "train_letters",
    "write_policy",
]
