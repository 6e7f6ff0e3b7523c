"""``rollcut engine``: the inference engine rollcut can run here (llama.cpp's server, built once)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from ._target import JsonOpt, app, console, fail, print_json

__all__ = ["engine_app"]

engine_app = typer.Typer(no_args_is_help=True, help="The local inference engine (llama.cpp's server).")
app.add_typer(engine_app, name="engine")


@engine_app.command("build")
def engine_build(as_json: JsonOpt = False) -> None:
    """Build llama.cpp's server from the package index once (about 6 minutes on 2 cores) and cache it;
    print where it is. Already built: prints the cached path at once."""
    from ..gym.model.engine import EngineUnavailableError, llama_server_binary

    try:
        with console.status("building llama-server from llama-cpp-python's sdist (cached after)"):
            path = llama_server_binary()
    except EngineUnavailableError as exc:
        raise fail(str(exc)) from exc
    if as_json:
        print_json({"llama_server": str(path)})
    else:
        console.print(str(path))


@engine_app.command("serve")
def engine_serve(
    home: Annotated[Path, typer.Option("--home", help="Where the tiny model is written.")] = Path(
        ".rollcut/engine"
    ),
    slots: Annotated[int, typer.Option(help="Concurrent generations.")] = 8,
    threads: Annotated[int, typer.Option(help="CPU threads.")] = 1,
) -> None:
    """llama.cpp's server on a tiny random model rollcut writes, on loopback, in the foreground:
    `rollcut serve model --backend engine --upstream URL` puts custody in front of it."""
    from ..gym.model.engine import EngineUnavailableError, tiny_engine

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with tiny_engine(home, slots=slots, threads=threads) as server:
            console.print(f"LISTENING {server.url}", soft_wrap=True)
            stop.wait()
    except EngineUnavailableError as exc:
        raise fail(str(exc)) from exc
    except KeyboardInterrupt:
        pass
