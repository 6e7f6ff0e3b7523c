"""A server of the plain stack as a process: ``python -m rollcut.bench._plain_serve KIND [ENV] --spec
JSON`` (what :func:`rollcut.bench._plain_stack.plain_server` starts). A module of its own, so running
it does not import it a second time through the package."""

from __future__ import annotations

import functools
import sys

from ..gym import decode_spec, run_servers, run_worker, worker_parser
from ._plain_stack import serve_plain

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    ap = worker_parser("python -m rollcut.bench._plain_serve", worker=False)
    ap.add_argument("named", nargs="+", help="the kind (and a resources server's environment)")
    args = ap.parse_args(argv)
    opts = decode_spec(args.spec)
    serve_one = functools.partial(serve_plain, opts)
    if args.worker_index is not None:  # one worker of several, started by the parent below
        run_worker(serve_one, args, opts.workers)
        return
    run_servers(
        host=opts.host,
        port=opts.port,
        workers=opts.workers,
        child_argv=[sys.executable, "-m", "rollcut.bench._plain_serve", *args.named, "--spec", args.spec],
        serve_one=serve_one,
    )


if __name__ == "__main__":
    main()
