"""llama.cpp's server on this machine: found, or built once from the package index and cached.

Why build: the engine must come from a package registry (no other network), and the only one
that ships llama.cpp's C++ server is the ``llama-cpp-python`` sdist, which vendors the whole of
llama.cpp. Its own Python server cannot take a token-id prompt, so rollcut builds the vendored
``llama-server`` target alone (CPU, portable: ``GGML_NATIVE=OFF``, static, no curl/ssl): about
5.5 minutes on 2 cores, once per machine. The binary is cached under the user's cache directory,
keyed by the pinned sdist and its digest; a lock makes concurrent test workers build it once.

``ROLLCUT_LLAMA_SERVER`` names a binary to use instead (one built with CUDA, say).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from ...._cache import cache_root as _cache_root
from ...._cache import locked as _locked
from ...._cache import wait_healthy
from ...._errors import RollcutError
from ...._process import free_port, lifeline

__all__ = ["LLAMA_CPP_SDIST", "EngineUnavailableError", "LlamaServer", "llama_server_binary", "tiny_engine"]

LLAMA_CPP_SDIST = (
    "llama-cpp-python",
    "0.3.36",
    "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
)
"""The sdist whose vendored llama.cpp is built: name, version, sha256 (as PyPI serves it)."""


class EngineUnavailableError(RollcutError):
    """No engine binary here and none can be built (no compiler, no cmake, no index)."""


def _cached_path() -> Path:
    name, version, digest = LLAMA_CPP_SDIST
    return _cache_root() / "engines" / f"{name}-{version}-{digest[:12]}" / "llama-server"


def _made_once(dest: Path, make: Callable[[Path], None], lock: Path) -> Path:
    """``dest`` in the cache, made the first time by ``make(staged)`` under ``lock`` (a file or a
    directory beside ``dest``) and renamed into place: whole or absent, whichever process asks
    first, and a make killed midway leaves nothing ``dest`` could be mistaken for."""
    if dest.exists():
        return dest
    with _locked(lock):
        if not dest.exists():  # another process may have made it while this one waited
            dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            staged = dest.with_name(f".{dest.name}.part")
            if staged.is_dir():
                shutil.rmtree(staged)
            staged.unlink(missing_ok=True)
            make(staged)
            staged.replace(dest)
    return dest


def _tool(name: str) -> str:
    """A build tool from this environment first (the ``cmake`` wheel), then the PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise EngineUnavailableError(f"building llama-server needs {name!r}: install it (pip install {name})")
    return found


def _run(argv: list[str], log: Path, cwd: Path | None = None) -> None:
    with open(log, "a") as out:
        code = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    if code != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise EngineUnavailableError(f"{argv[0]} {argv[1]} failed (exit {code}); last output:\n{tail}")


def _build(out: Path) -> None:
    """Build ``llama-server`` from the pinned sdist and copy it to ``out``."""
    name, version, digest = LLAMA_CPP_SDIST
    if shutil.which("c++") is None and shutil.which("g++") is None and shutil.which("clang++") is None:
        raise EngineUnavailableError("building llama-server needs a C++ compiler (c++, g++ or clang++)")
    with tempfile.TemporaryDirectory(prefix="rollcut-llama-") as tmp:
        work, log = Path(tmp), Path(tmp) / "build.log"
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
        _run([*pip, f"{name}=={version}", "-d", str(work)], log)
        sdists = list(work.glob("*.tar.gz"))
        if len(sdists) != 1 or hashlib.sha256(sdists[0].read_bytes()).hexdigest() != digest:
            raise EngineUnavailableError(
                f"the {name} {version} sdist is not the one pinned (sha256 {digest})"
            )
        with tarfile.open(sdists[0]) as tar:
            tar.extractall(work, filter="data")
        src = work / f"{name.replace('-', '_')}-{version}" / "vendor" / "llama.cpp"
        build = work / "build"
        flags = [
            "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=OFF",
            "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON",
            "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
        ]  # fmt: skip
        _run([_tool("cmake"), "-S", str(src), "-B", str(build), *flags], log)
        jobs = str(max(1, os.cpu_count() or 1))
        _run([_tool("cmake"), "--build", str(build), "--target", "llama-server", "-j", jobs], log)
        shutil.copy2(build / "bin" / "llama-server", out)
        out.chmod(0o755)


def llama_server_binary(*, build: bool = True) -> Path:
    """The ``llama-server`` to run: ``ROLLCUT_LLAMA_SERVER``, the cached build, or a new build."""
    named = os.environ.get("ROLLCUT_LLAMA_SERVER")
    if named:
        if not Path(named).is_file():
            raise EngineUnavailableError(f"ROLLCUT_LLAMA_SERVER={named} is not a file")
        return Path(named)
    dest = _cached_path()
    if dest.is_file():
        return dest
    if not build:
        raise EngineUnavailableError(f"no llama-server built yet (run `rollcut engine build`; cache {dest})")
    return _made_once(dest, _build, dest.parent.parent / ".build.lock")


class LlamaServer:
    """``llama-server`` as a child process on a free loopback port, with a model file."""

    def __init__(
        self,
        model: Path,
        *,
        binary: Path | None = None,
        ctx: int = 8192,
        slots: int = 4,
        threads: int = 1,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.binary = binary or llama_server_binary()
        self.extra = extra  # more of llama-server's options (a trainer's policy: a float32 KV cache)
        self.model, self.ctx, self.slots, self.threads = model, ctx, slots, threads
        self.port = 0
        self.eos_id: int | None = None  # the model's end token, when the caller knows it
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = model.with_suffix(".engine.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, port: int | None = None, timeout_s: float = 60.0) -> LlamaServer:
        """Start it (on the same port again after a kill, if given) and wait until it is healthy."""
        self.port = port or self.port or free_port()
        argv = [
            str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
            "-c", str(self.ctx), "-np", str(self.slots), "-t", str(self.threads), "-tb", str(self.threads),
            "--poll", "0",  # sleep between batches, not spin: the CPU is shared with the servers it serves
            "--metrics", "--no-webui", *self.extra,
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=lifeline())
        wait_healthy(
            "llama-server",
            self.proc,
            self.url,
            self.log_path,
            timeout_s,
            self.kill,
            error=EngineUnavailableError,
        )
        return self

    def _metric(self, name: str) -> float:
        for line in httpx.get(f"{self.url}/metrics", timeout=5.0).text.splitlines():
            if line.startswith(f"llamacpp:{name}"):
                return float(line.split()[-1])
        raise EngineUnavailableError(f"llama-server's metrics have no {name}")

    def tokens_predicted(self) -> int:
        """The engine's own count of tokens it generated (its Prometheus metrics; a request's tokens
        are counted when it ends, aborted or not)."""
        return int(self._metric("tokens_predicted_total"))

    def idle(self) -> bool:
        """No request is being processed (an aborted one has been counted)."""
        return self._metric("requests_processing") == 0

    def decoding(self, at_least: int = 1) -> int:
        """How many requests have decoded ``at_least`` tokens now (its ``/slots``)."""
        slots = httpx.get(f"{self.url}/slots", timeout=5.0).json()
        return sum(
            1
            for s in slots
            if s.get("is_processing")
            and any(t.get("n_decoded", 0) >= at_least for t in s.get("next_token") or [])
        )

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> LlamaServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.kill()


@contextlib.contextmanager
def tiny_engine(where: Path, *, slots: int = 8, threads: int = 1) -> Iterator[LlamaServer]:
    """llama.cpp's server on the tiny model, written into ``where`` (0700): the engine the demo and
    the benchmarks run on when no other is named. Killed on exit."""
    from ._tiny import write_tiny_gguf

    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    model = write_tiny_gguf(where / "tiny.gguf")
    with LlamaServer(model.path, ctx=slots * 2048, slots=slots, threads=threads) as server:
        server.eos_id = model.eos_id
        yield server
