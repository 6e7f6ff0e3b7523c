"""The negative control's resources server (run with ``python -m tests.e2e.amnesiac``).

A real counter resources process in every respect but one: a continued attempt's session is
seeded from the task again instead of being restored at the cut. An episode continued on it must
fail its verification; if it did not, the restore test would prove nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rollcut.gym import ResourcesServe, run_servers, serve_participant
from rollcut.gym.resources import Counter, ResourcesService, Session, create_resources_app
from rollcut.replay import AttemptView


class Amnesiac(ResourcesService):
    async def _build(self, view: AttemptView) -> Session | None:
        return None  # skip the restore: the continued attempt seeds a fresh session


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--credentials", type=Path, required=True)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    opts = ResourcesServe(
        url=args.url, namespace=args.namespace, credentials=str(args.credentials), env="counter"
    )

    async def serve_one(sock: Any, worker: int, peers: Any) -> None:
        def make(log: Any, instance: str, participant: Any) -> Any:
            service = Amnesiac(log, Counter(), instance=instance, participant=participant)
            return create_resources_app(service), service

        await serve_participant(opts, sock, worker, Counter.mode, make, peers=peers)

    run_servers(host="127.0.0.1", port=args.port, workers=1, child_argv=[], serve_one=serve_one)


if __name__ == "__main__":
    main()
