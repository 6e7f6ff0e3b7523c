"""The engine serves the policy being trained, and the trainer checks it did.

:class:`EngineSync` is a ``transformers`` ``TrainerCallback``: after every optimizer step it writes
the new weights as policy version ``global_step`` (:func:`write_policy`), stops the engine, writes
the version file the model server reads (``--policy-version-file``), and starts the engine on the
new file on the same port (a restart, not a swap: llama.cpp's server has no weight swap, and a
restart of the tiny policy costs a fraction of a second, ``restart_s``). In that order, a request
the model server sent under the old version reached the old engine or none, and one sent under the
new version reaches the new engine or none; calls running across the update (pipelined
collection) wait for the new engine (``--backend-option handover=S``) and go on, their tokens recorded
under the version of the request that made them (``rollcut.gym.model.engine``).

:class:`LogprobCheck` recomputes, for every completion token the engine generated, its
log-prob under the weights of the version the row records for that token (the Hugging Face
copy written beside the GGUF) and compares it with the engine's. Above ``bound`` the step
fails: rollcut's data would not be the policy's.

:class:`GlobalPublisher` runs after the trainer saved a step's checkpoint: it binds that
checkpoint, the step's rollcut checkpoint and the policy version in one global record, written
last (:mod:`._global`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..._errors import RollcutError
from ...gym.model.engine import LlamaServer
from ._global import GlobalCheckpoint, dir_digest, publish_global
from ._policy import PolicyFiles, load_policy, policy_files, write_policy

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    from ._rollout import RolloutFunction, Sequence

__all__ = [
    "ENGINE_FLAGS",
    "EngineSync",
    "GlobalPublisher",
    "LogprobCheck",
    "LogprobMismatchError",
    "policy_engine",
]

ENGINE_FLAGS = ("-fa", "off", "-ctk", "f32", "-ctv", "f32")
"""llama-server options for a policy whose log-probs are checked: its CPU flash attention
accumulates in half precision (|Δ| up to 1e-2 against torch on the tiny policy); without it and
with a float32 KV cache the agreement is about 1e-5."""


class LogprobMismatchError(RollcutError):
    """The engine's log-probs are not the policy's."""

    rollout_id: str | None = None


def policy_engine(files: PolicyFiles, *, slots: int = 4, threads: int = 1) -> LlamaServer:
    """llama-server on policy ``files`` (not started)."""
    return LlamaServer(files.gguf, slots=slots, threads=threads, extra=ENGINE_FLAGS)


def write_version(path: Path, version: int) -> None:
    """The model server's ``--policy-version-file``, replaced in one rename."""
    tmp = path.with_suffix(".part")
    tmp.write_text(f"{version}\n")
    os.replace(tmp, path)


class _Callback:
    """Duck-typed as a ``transformers`` ``TrainerCallback`` (importing rollcut needs no
    ``transformers``): every event a subclass does not define does nothing."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on_"):
            return lambda *a, **k: k.get("control", a[2] if len(a) > 2 else None)
        raise AttributeError(name)


class EngineSync(_Callback):
    """After each optimizer step: new weights to the engine, then the new version to the model
    server (see the module's docstring)."""

    def __init__(
        self,
        engine: LlamaServer,
        tokenizer: PreTrainedTokenizerFast,
        policy_dir: Path,
        version_file: Path,
    ) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        self.policy_dir, self.version_file = policy_dir, version_file
        self.written: list[PolicyFiles] = []
        self.restart_s: list[float] = []  # each weight update's engine restart, measured

    def publish(self, model: LlamaForCausalLM, version: int) -> PolicyFiles:
        """Write ``model`` as policy ``version`` and serve it."""
        return self.serve(write_policy(model, self.tokenizer, self.policy_dir, version))

    def serve(self, files: PolicyFiles) -> PolicyFiles:
        """The engine on policy ``files`` from now on: stop it, the new version, start it."""
        version = files.version
        t0 = time.perf_counter()
        self.engine.kill()
        write_version(self.version_file, version)  # between the two engines: see the module's docstring
        self.engine.model = files.gguf
        self.engine.start(port=self.engine.port)
        self.restart_s.append(time.perf_counter() - t0)
        self.written.append(files)
        return files

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> Any:
        self.publish(model, int(state.global_step))
        return control


class GlobalPublisher(_Callback):
    """After the trainer saved its checkpoint of a step: the global record binding it to the step's
    rollcut checkpoint and policy version (:mod:`._global`), published last."""

    def __init__(self, root: Path, rollout: RolloutFunction) -> None:
        self.root, self.rollout = root, rollout
        self.published: list[GlobalCheckpoint] = []

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        step = int(state.global_step)
        made = [s for s in self.rollout.steps if s.step == step - 1]
        if not made:
            raise RollcutError(f"the trainer saved step {step} without a collection for it")
        trainer = Path(args.output_dir) / f"checkpoint-{step}"
        ck = made[-1].checkpoint
        files = policy_files(self.root / "policy", step)
        record = GlobalCheckpoint(
            step=step,
            trainer_checkpoint=str(trainer.resolve().relative_to(self.root.resolve())),
            trainer_digest=dir_digest(trainer),
            rollcut_checkpoint_id=ck.checkpoint_id,
            token_snapshot_id=ck.token_snapshot_id,
            token_snapshot_digest=ck.token_snapshot_digest,
            policy_version=step,
            policy_gguf_sha256=files.digest,
            consumed=made[-1].rollout_ids,
            epoch=self.rollout.epoch,
            ts=time.time(),
        )
        publish_global(self.root, record)
        self.published.append(record)
        return control


@dataclass
class LogprobCheck:
    """|engine log-prob - torch log-prob| over every generated token, per step."""

    policy_dir: Path
    bound: float = 1e-3
    steps: list[dict[str, float]] = field(default_factory=list)
    _models: dict[int, Any] = field(default_factory=dict)

    def _model(self, version: int) -> Any:
        if version not in self._models:
            self._models[version] = load_policy(policy_files(self.policy_dir, version))[0]
        return self._models[version]

    def check(self, step: int, rollout_ids: list[str], sequences: list[Sequence]) -> dict[str, float]:
        import torch

        versions = sorted({v for seq in sequences for v in seq.versions if v >= 0})
        for old in set(self._models) - set(versions):  # one model per version in use, not per version ever
            del self._models[old]
        deltas: list[float] = []
        for rid, seq in zip(rollout_ids, sequences, strict=True):
            ids = torch.tensor([seq.prompt_ids + seq.completion_ids])
            start = len(seq.prompt_ids)
            tokens = torch.tensor(seq.completion_ids)
            engine = torch.tensor(seq.logprobs, dtype=torch.float64)
            made_by = torch.tensor(seq.versions)
            for version in sorted({v for v in seq.versions if v >= 0}):
                with torch.no_grad():
                    logp = torch.log_softmax(self._model(version)(ids).logits[0].float(), dim=-1)
                # position p predicts token p + 1: the completion's tokens, gathered in one step
                mine = logp[start - 1 : start - 1 + len(tokens)].gather(1, tokens[:, None])[:, 0].double()
                diff = (mine - engine).abs()[made_by == version]
                deltas += diff.tolist()
                if diff.numel() and float(diff.max()) > self.bound:
                    i = int(torch.nonzero(made_by == version)[int(diff.argmax())])
                    d = float(diff.max())
                    raise LogprobMismatchError(
                        f"step {step}, rollout {rid}: token {i} (version {version}) log-prob "
                        f"{seq.logprobs[i]:.6f} from the engine, {float(mine[i]):.6f} from the "
                        f"policy's weights (|Δ| {d:.2e} > {self.bound:.0e})",
                        rollout_id=rid,
                    )
        out = {
            "step": float(step),
            "tokens": float(len(deltas)),
            "mean_abs_delta": sum(deltas) / len(deltas) if deltas else 0.0,
            "max_abs_delta": max(deltas, default=0.0),
        }
        self.steps.append(out)
        return out
