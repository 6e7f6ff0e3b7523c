"""TRL's ``rollout_func`` as a rollcut collection step.

``GRPOTrainer(rollout_func=f)`` calls ``f(prompts, trainer)`` once per generation batch and
trains on what it returns: ``prompt_ids``, ``completion_ids`` and ``logprobs`` per completion
(one completion per prompt it is given; its sampler has already repeated each prompt
``num_generations`` times), plus any other key, which reaches the reward functions.

Here each completion is one rollout of a rollcut collection: its id is derived from the
trainer's step and the prompt's position in the batch (``<step * 10000 + position>-0``, plus
``epoch * 10**9`` once a restore went back past newer global checkpoints), so a step restarted
after a crash asks for the same rollouts, finds the rows already written and continues the ones
that were running from their last checkpoint. The arrays come from the rows
through :func:`rollcut.collect.read_turns`, which checks each turn against the token store's
record behind its receipt: what the trainer gets is what the engine generated, or an error.

A rollout of several model calls is one sequence when each call's prompt extends the previous
call's prompt and generation (tool and environment tokens in between are masked out with
``env_mask``); when it does not (a chat template that re-renders history), the rollout is
refused naming it, never silently trained on a sequence the policy did not see.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..._errors import RollcutError
from ...bus import BusConfig, EventLog, load_credentials
from ...collect import (
    NO_COMPACTION,
    CheckpointPolicy,
    CollectOptions,
    Collector,
    CollectorHooks,
    Summary,
    Turn,
    read_turns,
)
from ...ledger import CheckpointRecord, Ledger
from ...tokens import LocalTokenStore

if TYPE_CHECKING:
    from ._pipeline import Pipeline
    from ._sync import LogprobCheck

__all__ = [
    "Deployment",
    "RolloutFunction",
    "Sequence",
    "SequenceError",
    "StalenessError",
    "StepRecord",
    "admin_log",
    "reward_from_rollcut",
    "sequence_of",
]

STEP_STRIDE = 10_000
"""Task indexes per trainer step: a generation batch holds fewer completions than this."""
EPOCH_STRIDE = 10**9
"""Task indexes per epoch (see :func:`rollcut.integrations.trl.restorable`)."""


class SequenceError(RollcutError):
    """A rollout's model calls are not one token sequence (a later prompt does not extend the
    earlier prompt and generation), so it cannot be one completion for the trainer."""

    rollout_id: str | None = None
    turn: int | None = None


class StalenessError(RollcutError):
    """A row holds tokens more policy versions behind the trainer than ``max_staleness`` allows."""

    rollout_id: str | None = None
    step: int | None = None


@dataclass(frozen=True)
class Deployment:
    """Where the rollouts run: the bus (the collector role's credentials), the namespace's ledger
    and token store on this host, and the environment server the collector drives."""

    url: str
    namespace: str
    credentials: Path
    ledger: Path
    tokens: Path
    environment_url: str
    rows: Path  # a directory: one rows file per trainer step

    async def connect(self, name: str) -> EventLog:
        """The namespace's log as the admin role, as ``rollcut collect`` runs: a collector that
        recovers must be able to checkpoint (the collector role may not write the marker)."""
        return await admin_log(self.url, self.namespace, self.credentials, name)


async def admin_log(url: str, namespace: str, credentials: Path, name: str) -> EventLog:
    """A connection to ``namespace`` as its admin role (``credentials``: the namespace's file)."""
    config = BusConfig(url=url, namespace=namespace).as_role(load_credentials(credentials), "admin")
    return await EventLog.connect(config, name=name)


@dataclass
class StepRecord:
    """What one call of the rollout function did."""

    step: int
    rollout_ids: list[str]
    rewards: list[float]
    versions: list[tuple[int, int]]  # each rollout's (first, last) policy version
    recovery: dict[str, int]
    checkpoints_published: int
    checkpoint: CheckpointRecord  # the rollcut checkpoint taken once every row of the step was written
    logprobs: dict[str, float] | None = None  # the engine against the policy's weights (LogprobCheck)
    collect_s: float = 0.0  # the collection's own time
    waited_s: float = 0.0  # how long the trainer waited for it (less than collect_s when it ran ahead)


@dataclass(frozen=True)
class Sequence:
    """One rollout as one training sequence."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    env_mask: list[int]  # 1 where the policy generated the token
    versions: list[int]  # the policy version of each completion token (-1 where env_mask is 0)


def sequence_of(rollout_id: str, turns: list[Turn]) -> Sequence:
    """The rollout's turns as one prompt and one completion (see the module's docstring)."""
    first = turns[0]
    seen = [*first.prompt_ids, *first.generation_ids]
    completion, logprobs = list(first.generation_ids), list(first.generation_log_probs)
    mask = [1] * len(first.generation_ids)
    versions = list(first.generation_versions)
    for t in turns[1:]:
        if t.prompt_ids[: len(seen)] != seen:
            raise SequenceError(
                f"rollout {rollout_id}: turn {t.turn}'s prompt does not extend the turns before it",
                rollout_id=rollout_id,
                turn=t.turn,
            )
        between = t.prompt_ids[len(seen) :]
        completion += [*between, *t.generation_ids]
        logprobs += [0.0] * len(between) + list(t.generation_log_probs)
        mask += [0] * len(between) + [1] * len(t.generation_ids)
        versions += [-1] * len(between) + list(t.generation_versions)
        seen = [*t.prompt_ids, *t.generation_ids]
    return Sequence(list(first.prompt_ids), completion, logprobs, mask, versions)


@dataclass
class RolloutFunction:
    """``rollout_func`` for TRL's ``GRPOTrainer``: each call collects one step's rollouts with
    rollcut (checkpoints every ``checkpoint_every_s``) and returns their checked token arrays.

    ``task_of(prompt)`` says what a prompt is to the environment: its ``env``, ``verify`` and
    ``seed`` fields (a NeMo Gym row's); ``params`` are request settings every model call gets
    (``max_output_tokens``, ``temperature``). The reward of each rollout (its ``/verify``) is
    returned as ``rollcut_reward`` for a reward function to pass on (:func:`reward_from_rollcut`).
    """

    deployment: Deployment
    task_of: Callable[[Any], dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)
    checkpoint_every_s: float | None = 2.0
    concurrency: int = 16
    on_step: Callable[[StepRecord], None] | None = None
    check: LogprobCheck | None = None  # every generated token's log-prob against the policy's weights
    epoch: int = 0
    crash_at: int | None = None  # the fault ``--crash-at-step`` injects: in that step's collection,
    crash: Callable[[dict[str, Any]], None] | None = None  # once some rows are written, not all
    max_staleness: int = 0  # > 0: collect up to that many steps ahead, while the trainer trains (._pipeline)
    prompts_for: Callable[[int], list[Any]] | None = None  # a later step's prompts (default: TRL's sampler)
    steps: list[StepRecord] = field(default_factory=list)
    _pipeline: Pipeline[tuple[StepRecord, list[Sequence]]] | None = field(default=None, repr=False)

    def rows_of(self, prompts: list[Any], step: int) -> list[dict[str, Any]]:
        """The step's input rows: one NeMo Gym row per completion asked for."""
        rows = []
        for position, prompt in enumerate(prompts):
            messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
            rows.append(
                {
                    "responses_create_params": {"input": messages, "tools": [], **self.params},
                    "agent_ref": {"type": "responses_api_agents", "name": "simple_agent"},
                    "_ng_task_index": self.epoch * EPOCH_STRIDE + step * STEP_STRIDE + position,
                    "max_steps": 8,
                    **self.task_of(prompt),
                }
            )
        return rows

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        step = int(trainer.state.global_step)
        if len(prompts) >= STEP_STRIDE:
            raise RollcutError(f"a generation batch of {len(prompts)} prompts: at most {STEP_STRIDE - 1}")
        t0 = time.perf_counter()
        record, sequences = self._step(prompts, step, trainer)
        record.waited_s = time.perf_counter() - t0
        self._fresh_enough(record, sequences)
        if self.check is not None:
            record.logprobs = self.check.check(step, record.rollout_ids, sequences)
        self.steps.append(record)
        if self.on_step is not None:
            self.on_step(record)
        return {
            "prompt_ids": [s.prompt_ids for s in sequences],
            "completion_ids": [s.completion_ids for s in sequences],
            "logprobs": [s.logprobs for s in sequences],
            "env_mask": [s.env_mask for s in sequences],
            "rollcut_reward": record.rewards,
            "rollcut_rollout_id": record.rollout_ids,
        }

    def _step(self, prompts: list[Any], step: int, trainer: Any) -> tuple[StepRecord, list[Sequence]]:
        """The step's collection: run now, or (pipelined) the one started while the step before it
        trained, with the steps after it started before this returns."""
        if self.max_staleness <= 0:
            return asyncio.run(self._collect(prompts, step))
        from ._pipeline import Pipeline, sampler_prompts, steps_per_batch

        if self._pipeline is None:
            self._pipeline = Pipeline(self._collect)
        if self.prompts_for is None:
            self.prompts_for = sampler_prompts(trainer)
        pipeline = self._pipeline
        stride = steps_per_batch(trainer)
        if not pipeline.started(step):
            pipeline.start(step, prompts)
        for ahead in range(1, self.max_staleness + 1):
            later = step + ahead * stride
            if later < int(trainer.state.max_steps) and not pipeline.started(later):
                pipeline.start(later, self.prompts_for(later))
        return pipeline.take(step, prompts)

    def close(self) -> None:
        """Stop the collections running ahead (their rollouts stay, for a resumed run to find)."""
        if self._pipeline is not None:
            self._pipeline.close()
            self._pipeline = None

    def _fresh_enough(self, record: StepRecord, sequences: list[Sequence]) -> None:
        """Every token within ``max_staleness`` versions of the trainer's (its version is the
        step): the bound a pipelined run promises, checked on what the trainer is handed."""
        for rid, seq in zip(record.rollout_ids, sequences, strict=True):
            made = [v for v in seq.versions if v >= 0]
            if made and record.step - min(made) > self.max_staleness:
                raise StalenessError(
                    f"step {record.step}, rollout {rid}: tokens of policy version {min(made)}, "
                    f"{record.step - min(made)} behind (max_staleness {self.max_staleness})",
                    rollout_id=rid,
                    step=record.step,
                )

    def _fault(self, step: int) -> Callable[[dict[str, Any]], None] | None:
        """The crash to inject in ``step``'s collection, if this is the step."""
        return self.crash if step == self.crash_at else None

    def _hooks(self, step: int) -> CollectorHooks | None:
        """At ``crash_at``, the fault, mid-step: the moment a row is written while other rollouts
        are still running (their generations in flight)."""
        crash = self._fault(step)
        if crash is None:
            return None

        def progress(summary: Summary, total: int, running: int) -> None:
            if 0 < summary.results_written < total and running > 0:
                written = summary.results_written
                crash({"step": step, "rows_written": written, "of": total, "running": running})

        return CollectorHooks(progress=progress)

    async def _collect(self, prompts: list[Any], step: int) -> tuple[StepRecord, list[Sequence]]:
        dep = self.deployment
        t0 = time.perf_counter()
        rows_file = dep.rows / f"step-{step:06d}.jsonl"
        rows_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        log = await dep.connect(f"trl-step-{step}")
        try:
            with Ledger(dep.ledger) as ledger, LocalTokenStore(dep.tokens) as tokens:
                collector = Collector(
                    log,
                    ledger,
                    tokens,
                    CollectOptions(
                        environment_url=dep.environment_url,
                        concurrency=self.concurrency,
                        checkpoint=CheckpointPolicy(every_s=self.checkpoint_every_s),
                        compaction=NO_COMPACTION,  # the step reads its rollouts' turns from the log after
                    ),
                    tasks=self.rows_of(prompts, step),
                    output=rows_file,
                    instance=f"trl-{step}",
                    hooks=self._hooks(step),
                )
                summary = await collector.run(resume=rows_file.exists())
                if (crash := self._fault(step)) is not None:  # it finished before the hook saw it
                    crash({"step": step, "rows_written": summary.results_written, "of": len(prompts)})
                unwritten = sorted(set(summary.pending) | set(summary.gave_up))
                if summary.results_written != len(prompts) or unwritten or summary.failed:
                    raise RollcutError(
                        f"step {step}: {summary.results_written} of {len(prompts)} rollouts written "
                        f"(unwritten: {unwritten[:5]}, failures: {summary.failed})"
                    )
                checkpoint_id = await collector.checkpoint()  # the step's rollcut half (global checkpoint)
                checkpoint = None if checkpoint_id is None else ledger.checkpoint(checkpoint_id)
                if checkpoint is None:
                    raise RollcutError(f"step {step}: no checkpoint published after its collection")
                order = collector.rollout_ids()
                by_rollout: dict[str, list[Turn]] = {}
                for turn in read_turns(rows_file, tokens):
                    by_rollout.setdefault(turn.rollout_id, []).append(turn)
        finally:
            await log.close()
        sequences = [sequence_of(rid, sorted(by_rollout[rid], key=lambda t: t.turn)) for rid in order]
        record = StepRecord(
            step=step,
            rollout_ids=order,
            rewards=[by_rollout[rid][0].reward for rid in order],
            versions=[_span(s.versions) for s in sequences],
            recovery=dict(summary.recovery),
            checkpoints_published=summary.checkpoints_published,
            checkpoint=checkpoint,
            collect_s=time.perf_counter() - t0,
        )
        return record, sequences


def _span(versions: list[int]) -> tuple[int, int]:
    mine = [v for v in versions if v >= 0]
    return (min(mine), max(mine)) if mine else (-1, -1)


def reward_from_rollcut(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """A TRL reward function: the environment's ``/verify`` reward the rollout function returned."""
    return [float(r) for r in kwargs["rollcut_reward"]]
