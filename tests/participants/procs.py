"""Participant and coordinator processes for fault tests (run with ``python -m``).

Each prints one line per milestone on stdout (READY, PREPARING, SEALED) and
flushes, so a test can SIGKILL it at an exact point without sleeping.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from rollcut.bus import BusConfig, EventLog
from rollcut.ledger import Ledger
from rollcut.participants import Coordinator, Participant
from rollcut.tokens import LocalTokenStore


def say(word: str) -> None:
    sys.stdout.write(word + "\n")
    sys.stdout.flush()


class SlowExport:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def prepare(self, checkpoint_id: str) -> list[str]:
        say("PREPARING")
        await asyncio.sleep(self.seconds)  # the state export this process is killed in
        return []

    async def restore(self, checkpoint_id: str, cut: int) -> None:
        return None


async def participant(args: argparse.Namespace) -> None:
    log = await EventLog.connect(BusConfig(url=args.url, namespace=args.ns))
    hooks = SlowExport(args.slow_export) if args.slow_export else None
    p = Participant(
        log,
        component=args.component,
        instance=args.instance,
        mode=args.mode,
        hooks=hooks,
        group=args.group,
        worker=args.worker,
        workers=args.workers,
        lease_grace_s=args.grace,
    )
    await p.start()
    say("READY")
    await asyncio.Event().wait()


async def coordinator(args: argparse.Namespace) -> None:
    log = await EventLog.connect(BusConfig(url=args.url, namespace=args.ns))
    with Ledger(Path(args.ledger)) as led, LocalTokenStore(Path(args.tokens)) as tokens:
        co = Coordinator(log, led, tokens, grace_s=args.grace)

        async def hang_after(phase: str) -> None:
            if phase == args.hang_after:
                say(f"AFTER {phase}")
                await asyncio.Event().wait()

        co.after_phase = hang_after
        res = await co.checkpoint(deadline_s=args.deadline)
        say(f"PUBLISHED {res.record.checkpoint_id}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["participant", "coordinator"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--ns", required=True)
    ap.add_argument("--instance", default="p0")
    ap.add_argument("--component", default="resources")
    ap.add_argument("--mode", default="exported")
    ap.add_argument("--group", default="")
    ap.add_argument("--worker", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--slow-export", type=float, default=0.0)
    ap.add_argument("--grace", type=float, default=0.5)
    ap.add_argument("--ledger", default="")
    ap.add_argument("--tokens", default="")
    ap.add_argument("--deadline", type=float, default=5.0)
    ap.add_argument("--hang-after", default="")
    args = ap.parse_args()
    asyncio.run(participant(args) if args.role == "participant" else coordinator(args))


if __name__ == "__main__":
    main()
