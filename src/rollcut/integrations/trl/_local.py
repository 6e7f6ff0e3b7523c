"""A whole training loop's deployment on one host, for the example, the tests and ``bench train``.

JetStream with role credentials, llama.cpp's server on policy version 0, rollcut's model
server in front of it (engine backend, training data on, ``--policy-version-file``), one
resources server for the task's environment, the Simple Agent and the environment server, each
its own process; and the policy itself, written once as both the trainer's model and the
engine's GGUF. Everything lives under one directory (0700) and every process is killed on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._home import credentials_for
from ...bus import BusConfig, EmbeddedServer, EventLog, load_credentials
from ...gym.model.engine import LlamaServer
from ...testing import ServerProcess, start_stack
from ._policy import PolicyFiles, new_policy, write_policy
from ._rollout import Deployment
from ._sync import policy_engine, write_version

__all__ = ["LocalLoop", "local_loop"]


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


async def _create_stream(url: str, credentials: Path, namespace: str) -> None:
    config = BusConfig(url=url, namespace=namespace).as_role(load_credentials(credentials), "admin")
    log = await EventLog.connect(config)
    await log.close()


@contextlib.contextmanager
def local_loop(
    root: Path, *, env: str = "letters", namespace: str = "trl", seed: int = 0, threads: int = 1
) -> Iterator[LocalLoop]:
    """Start the deployment under ``root`` (see the module's docstring); stop it all on exit."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    policy_dir = root / "policy"
    policy_dir.mkdir(exist_ok=True, mode=0o700)
    model, tokenizer = new_policy(seed=seed)
    files = write_policy(model, tokenizer, policy_dir, 0)
    version_file = policy_dir / "version"
    write_version(version_file, 0)
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
            },
        )
        for server in stack:
            stack_of.callback(server.kill)
        deployment = Deployment(
            url=nats.url,
            namespace=namespace,
            credentials=creds,
            ledger=root / "ledger",
            tokens=root / "tokens",
            environment_url=stack[-1].url,
            rows=root / "rows",
        )
        yield LocalLoop(model, tokenizer, files, policy_dir, version_file, engine, deployment, stack)
