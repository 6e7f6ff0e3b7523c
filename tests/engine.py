"""The inference engine the engine tests run against, as a real process.

By default: llama.cpp's ``llama-server`` (built once from the package index and cached, see
``rollcut.gym.model.engine._llamacpp``) on a tiny model this suite writes itself. On a machine
with a GPU and a real model, the same tests run against vLLM or SGLang:

    ROLLCUT_ENGINE_CMD="vllm serve Qwen/Qwen3-0.6B --port 8000" \\
    ROLLCUT_ENGINE_URL=http://127.0.0.1:8000 ROLLCUT_ENGINE_DIALECT=vllm \\
    ROLLCUT_ENGINE_MODEL=Qwen/Qwen3-0.6B ROLLCUT_ENGINE_EOS=151645 \\
    .venv/bin/python -m pytest tests -k engine

or SGLang's runtime (``ROLLCUT_ENGINE_CMD="python -m sglang.launch_server --model-path
Qwen/Qwen3-0.6B --port 30000"``, ``ROLLCUT_ENGINE_URL=http://127.0.0.1:30000``,
``ROLLCUT_ENGINE_DIALECT=sglang``).

(``ROLLCUT_ENGINE_EOS`` is the model's end-of-sequence id: tests that need a long generation
forbid it with ``logit_bias``.) More in ``docs/engines.md``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from rollcut.gym.model.engine import (
    ENGINE_MODELS,
    EngineBackend,
    LlamaServer,
    engine_backend,
    engine_model_file,
    llama_server_binary,
    write_tiny_gguf,
)


class Engine:
    """One engine process the test may kill and start again on the same port."""

    def __init__(self, tmp: Path, *, ascii_only: bool = True, named: str = "tiny", slots: int = 8) -> None:
        self.dialect = os.environ.get("ROLLCUT_ENGINE_DIALECT", "llama.cpp")
        self.model = os.environ.get("ROLLCUT_ENGINE_MODEL", "")
        self.cmd = os.environ.get("ROLLCUT_ENGINE_CMD", "")
        self.external_url = os.environ.get("ROLLCUT_ENGINE_URL", "")
        self.server: LlamaServer | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        eos = os.environ.get("ROLLCUT_ENGINE_EOS")
        if not self.external_url and named != "tiny":  # a named real model (rollcut engine model)
            binary = llama_server_binary(build=False)
            path = engine_model_file(named)
            self.server = LlamaServer(
                path,
                binary=binary,
                ctx=slots * 2048,
                slots=slots,
                threads=1,
                extra=ENGINE_MODELS[named].server_flags,
            )
            self.server.log_path = tmp / f"{named}.engine.log"
            eos = str(ENGINE_MODELS[named].eos_id)
        elif not self.external_url:
            tiny = write_tiny_gguf(tmp / "tiny.gguf", ascii_only=ascii_only)
            # built before the suite (the README's test command runs `rollcut engine build`): a
            # build inside a test would run into the test's timeout
            binary = llama_server_binary(build=False)
            self.server = LlamaServer(tiny.path, binary=binary, ctx=8 * 2048, slots=8, threads=1)
            eos = str(tiny.eos_id)
        self.no_eos: dict[str, int] = {eos: -100} if eos else {}
        self.long = 600  # tokens a generation needs to outlast a checkpoint taken while it runs

    @classmethod
    def running(cls, tmp: Path, url: str, *, dialect: str, model: str, eos: int) -> Engine:
        """An engine started elsewhere (vLLM, shared by a module's tests): this wraps its URL."""
        eng = cls.__new__(cls)
        eng.dialect, eng.model, eng.cmd, eng.external_url = dialect, model, "", url
        eng.server, eng.proc = None, None
        eng.no_eos = {str(eos): -100}
        eng.long = 600
        return eng

    @property
    def url(self) -> str:
        return self.server.url if self.server is not None else self.external_url

    def start(self) -> Engine:
        if self.server is not None:
            self.server.start()
        elif self.cmd:
            self.proc = subprocess.Popen(shlex.split(self.cmd))
            give_up = time.monotonic() + 600
            while time.monotonic() < give_up:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                        return self
                time.sleep(0.5)  # a real model loads for minutes; it has no other way to say it is ready
            raise RuntimeError(f"the engine at {self.url} did not become healthy")
        return self

    def kill(self) -> None:
        """SIGKILL the engine (and reap it)."""
        if self.server is not None:
            self.server.kill()
        elif self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def tokens_predicted(self) -> int:
        """The engine's own count of tokens it generated, from its Prometheus metrics."""
        if self.server is not None:
            return self.server.tokens_predicted()
        names = ("vllm:generation_tokens_total", "sglang:generation_tokens_total")
        lines = httpx.get(f"{self.url}/metrics", timeout=5).text.splitlines()
        return int(sum(float(line.split()[-1]) for line in lines if line.startswith(names)))

    def idle(self) -> bool:
        """No request is being processed (an aborted one has stopped counting)."""
        if self.server is not None:
            return self.server.idle()
        lines = httpx.get(f"{self.url}/metrics", timeout=5).text.splitlines()
        return all(float(ln.split()[-1]) == 0 for ln in lines if ln.startswith("vllm:num_requests_running"))

    def decoding(self, at_least: int = 1) -> int | None:
        """How many requests have decoded ``at_least`` tokens now (None when the engine does not say)."""
        return self.server.decoding(at_least) if self.server is not None else None

    async def detokenize(self, ids: list[int]) -> str:
        """The engine's own text of ``ids`` (its detokenize route, in its dialect)."""
        async with httpx.AsyncClient(base_url=self.url, timeout=30) as client:
            return await self.backend().dialect.detokenize(client, ids)

    def backend(self, **kw: Any) -> EngineBackend:
        return engine_backend(self.url, self.dialect, model=self.model, **kw)

    def serve_args(self) -> list[str]:
        """``rollcut serve model`` flags that put this engine behind the model server."""
        args = ["--backend", "engine", "--upstream", self.url, "--backend-option", f"dialect={self.dialect}"]
        return args + (["--backend-option", f"model={self.model}"] if self.model else [])
