"""A whole training loop's deployment on one host, for the example, the tests and ``bench train``.

JetStream with role credentials, llama.cpp's server on policy version 0, rollcut's model
server in front of it (engine backend, training data on, ``--policy-version-file``), one
resources server for the task's environment, the Simple Agent and the environment server, each
its own process; and the policy itself, written once as both the trainer's model and the
engine's GGUF. Everything lives under one directory (0700) and every process is killed on exit.

Started again on a directory a killed run left, it resumes: the newest global checkpoint whose
halves verify (:func:`restorable`) says which trainer checkpoint to load and which policy
version the engine serves; JetStream, the ledger and the token store are the ones on disk, so
the step that was running finds its rollouts. :meth:`LocalLoop.crash` is the fault the tests
and ``--crash-at-step`` inject: SIGKILL to every process of the loop, this one last.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from ..._home import credentials_for
from ...bus import EmbeddedServer, load_credentials
from ...gym.model.engine import LlamaServer
from ...ledger import Ledger
from ...testing import ServerProcess, start_stack
from ...tokens import LocalTokenStore
from ._global import RestorePoint, restart_step, restorable, set_aside
from ._policy import PolicyFiles, new_policy, policy_files, write_policy
from ._rollout import Deployment, admin_log
from ._sync import policy_engine, write_version

__all__ = ["LocalLoop", "local_loop"]

ENGINE_HANDOVER_S = 60.0
"""How long a model call waits for llama-server through a weight update (a restart of the tiny
policy takes well under a second; a loaded CI machine, a few)."""


@dataclass
class LocalLoop:
    """What :func:`local_loop` started."""

    model: Any  # transformers' LlamaForCausalLM: policy version 0, the trainer's to train
    tokenizer: Any
    policy: PolicyFiles
    policy_dir: Path
    version_file: Path
    engine: LlamaServer
    deployment: Deployment
    stack: list[ServerProcess]
    nats: EmbeddedServer
    root: Path
    restored: RestorePoint | None = None  # None: a new run; else what it resumed from

    @property
    def resume_from(self) -> str | None:
        """The trainer checkpoint to resume from (``trainer.train(resume_from_checkpoint=...)``)."""
        rec = None if self.restored is None else self.restored.record
        return None if rec is None else str(self.root / rec.trainer_checkpoint)

    @property
    def epoch(self) -> int:
        return 0 if self.restored is None else self.restored.epoch

    def crash(self, why: dict[str, Any]) -> NoReturn:
        """SIGKILL every process of the loop, then this one (the trainer); ``why`` lands in
        ``crash.json`` first, for whoever looks at the run afterwards."""
        (self.root / "crash.json").write_text(json.dumps(why))
        for server in self.stack:
            server.kill()
        self.engine.kill()
        self.nats.kill()
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable: SIGKILL is not caught")  # pragma: no cover


async def _create_stream(url: str, credentials: Path, namespace: str) -> None:
    log = await admin_log(url, namespace, credentials, "trl-setup")
    await log.close()


@contextlib.contextmanager
def local_loop(
    root: Path,
    *,
    env: str = "letters",
    namespace: str = "trl",
    seed: int = 0,
    threads: int = 1,
    restart: bool = False,
    max_staleness: int = 0,
) -> Iterator[LocalLoop]:
    """Start the deployment under ``root`` (see the module's docstring); stop it all on exit.
    Resuming with ``restart``, the interrupted step is collected again from nothing. The model
    server continues no prefix more than ``max_staleness`` versions old, and waits for the engine
    through a weight update's restart."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    policy_dir = root / "policy"
    restored = _restore_point(root, restart) if (policy_dir / "v0.gguf").exists() else None
    policy_dir.mkdir(exist_ok=True, mode=0o700)
    model, tokenizer = new_policy(seed=seed)  # version 0: a resumed trainer loads its checkpoint over it
    rec = None if restored is None else restored.record
    files = (
        write_policy(model, tokenizer, policy_dir, 0) if rec is None else policy_files(policy_dir, rec.step)
    )
    version_file = policy_dir / "version"
    write_version(version_file, files.version)
    credentials_for(root / "nats", namespace)
    creds = root / "nats" / "credentials.json"
    with contextlib.ExitStack() as stack_of:
        nats = stack_of.enter_context(EmbeddedServer(root / "nats", credentials=load_credentials(creds)))
        asyncio.run(_create_stream(nats.url, creds, namespace))
        engine = policy_engine(files, threads=threads)
        stack_of.callback(engine.kill)
        engine.start()
        stack = start_stack(
            nats.url,
            creds,
            root / "tokens",
            namespace=namespace,
            envs=(env,),
            agent_workers=1,
            token_delay=0.0,
            logs=root / "logs",
            model_options={
                "backend": "engine",
                "upstream": engine.url,
                "policy_version_file": str(version_file),
                "max_policy_lag": max_staleness,
                "backend_options": {"handover": str(ENGINE_HANDOVER_S)},
            },
        )
        for server in stack:
            stack_of.callback(server.close)
        deployment = Deployment(
            url=nats.url,
            namespace=namespace,
            credentials=creds,
            ledger=root / "ledger",
            tokens=root / "tokens",
            environment_url=stack[-1].url,
            rows=root / "rows",
        )
        yield LocalLoop(
            model, tokenizer, files, policy_dir, version_file, engine, deployment, stack, nats, root, restored
        )


def _restore_point(root: Path, restart: bool) -> RestorePoint:
    """Where a run killed under ``root`` resumes (records it passed over are set aside; with
    ``restart``, the interrupted step's rows too)."""
    with Ledger(root / "ledger") as ledger, LocalTokenStore(root / "tokens") as tokens:
        point = restorable(root, ledger, tokens)
    if restart:
        point = restart_step(point)
    set_aside(root, point)
    return point
