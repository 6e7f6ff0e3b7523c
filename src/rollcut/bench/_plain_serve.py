"""A server of the plain stack as a process: ``python -m rollcut.bench._plain_serve KIND [ENV] --spec
JSON`` (what :func:`rollcut.bench._plain_stack.plain_server` starts). A module of its own, so running
it does not import it a second time through the package."""

from __future__ import annotations

import argparse
import sys

from ..gym import decode_spec, run_servers, run_worker
from ._plain_stack import serve_plain

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rollcut.bench._plain_serve")
    ap.add_argument("named", nargs="+", help="the kind (and a resources server's environment)")
    ap.add_argument("--spec", required=True)
    ap.add_argument("--worker-index", type=int)
    ap.add_argument("--listen-fd", type=int)
    ap.add_argument("--peer-fd", type=int)
    ap.add_argument("--peers-dir", default="")
    args = ap.parse_args(argv)
    opts = decode_spec(args.spec)
    if args.worker_index is not None:  # one worker of several, started by the parent below
        run_worker(
            lambda sock, i, peers: serve_plain(opts, sock, i, peers),
            args.listen_fd,
            args.worker_index,
            opts.workers,
            args.peer_fd,
            args.peers_dir,
        )
        return
    run_servers(
        host=opts.host,
        port=opts.port,
        workers=opts.workers,
        child_argv=[sys.executable, "-m", "rollcut.bench._plain_serve", *args.named, "--spec", args.spec],
        serve_one=lambda sock, i, peers: serve_plain(opts, sock, i, peers),
    )


if __name__ == "__main__":
    main()
