"""The baseline of ``bench model`` as a process: ``python -m rollcut.bench._plain_model_serve``. It
prints ``LISTENING <url>`` and ``READY plain pid=<pid>`` like a Gym server. A module of its own: the
package imports ``_plain_model`` (the plain stack uses its service), and running that one with
``-m`` would import it a second time."""

from __future__ import annotations

import argparse
import asyncio

from ..gym import bind, say, serve_on
from ..gym.model import LocalBackend, create_app
from ._plain_model import PlainModelService

__all__ = ["main"]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m rollcut.bench._plain_model_serve")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sock = bind("127.0.0.1", args.port)
    say(f"LISTENING http://127.0.0.1:{sock.getsockname()[1]}")
    app = create_app(PlainModelService(LocalBackend(seed=args.seed)))
    asyncio.run(serve_on(app, [sock], "plain"))


if __name__ == "__main__":
    main()
