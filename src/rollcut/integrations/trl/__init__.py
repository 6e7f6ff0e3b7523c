"""rollcut under TRL (the ``trl`` extra): a ``rollout_func`` for ``GRPOTrainer`` whose rollouts are
rollcut collections, and a policy the trainer and the engine load from the same weights.

The contract this implements is ``docs/trainer-integration.md``.
"""

from ._global import GlobalCheckpoint, RestorePoint, consumed_history, dir_digest, publish_global, restorable
from ._local import LocalLoop, local_loop
from ._main import main
from ._pipeline import Pipeline, PipelineError, sampler_prompts
from ._policy import (
    POLICY_SHAPE,
    PolicyFiles,
    PolicyManifest,
    from_gguf_layout,
    load_policy,
    new_policy,
    policy_files,
    to_gguf_layout,
    write_policy,
)
from ._rollout import (
    Deployment,
    RolloutFunction,
    Sequence,
    SequenceError,
    StalenessError,
    StepRecord,
    reward_from_rollcut,
    sequence_of,
)
from ._run import LETTERS_PROMPT, train_letters
from ._sync import (
    ENGINE_FLAGS,
    EngineSync,
    GlobalPublisher,
    LogprobCheck,
    LogprobMismatchError,
    policy_engine,
)

__all__ = [
    "ENGINE_FLAGS",
    "LETTERS_PROMPT",
    "POLICY_SHAPE",
    "Deployment",
    "EngineSync",
    "GlobalCheckpoint",
    "GlobalPublisher",
    "LocalLoop",
    "LogprobCheck",
    "LogprobMismatchError",
    "Pipeline",
    "PipelineError",
    "PolicyFiles",
    "PolicyManifest",
    "RestorePoint",
    "RolloutFunction",
    "Sequence",
    "SequenceError",
    "StalenessError",
    "StepRecord",
    "consumed_history",
    "dir_digest",
    "from_gguf_layout",
    "load_policy",
    "local_loop",
    "main",
    "new_policy",
    "policy_engine",
    "policy_files",
    "publish_global",
    "restorable",
    "reward_from_rollcut",
    "sampler_prompts",
    "sequence_of",
    "to_gguf_layout",
    "train_letters",
    "write_policy",
]
