"""An attacker with the model role's file: it answers every membership ping as instances it is not.

argv: NATS url, the model role's credentials file, where to write what it saw. Prints LISTENING
once subscribed; writes ``{"pings": n, "denied": [subject...]}`` when terminated.
"""

import asyncio
import json
import signal
import sys
from pathlib import Path

import msgspec
import nats

from rollcut.bus import BusConfig, load_credentials, login_options
from rollcut.participants import Hello

url, creds_path, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
creds = load_credentials(creds_path)
prefix = f"rc.{creds.namespace}"
# (subject it publishes on, the group/worker it claims): a made-up agent, the real agent, a sibling
IMPERSONATE = [
    ("hello.agent.ghost-w0", "ghost", 0),
    ("hello.agent.agent-w0", "agent", 0),
    ("hello.model.model-w1", "model", 1),
]


async def main() -> None:
    seen = {"pings": 0, "denied": []}
    denied: list[str] = seen["denied"]  # type: ignore[assignment]

    async def on_error(exc: Exception) -> None:
        text = str(exc)
        for subject, _, _ in IMPERSONATE:
            if f'"{prefix}.{subject}"' in text and subject not in denied:
                denied.append(subject)

    login = login_options(BusConfig(url=url).as_role(creds, "model", "model-w0"))
    nc = await nats.connect(url, error_cb=on_error, **login)

    async def on_ping(msg: nats.aio.msg.Msg) -> None:
        seen["pings"] += 1
        for subject, group, worker in IMPERSONATE:
            hello = Hello(
                round=msg.data.decode(),
                process="evil",
                group=group,
                worker=worker,
                workers=2,
                mode="exported",
            )
            await nc.publish(f"{prefix}.{subject}", msgspec.json.encode(hello))
        await nc.flush()

    await nc.subscribe(f"{prefix}.ping", cb=on_ping)
    await nc.flush()
    print("LISTENING", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await nc.flush()
    await nc.close()
    out.write_text(json.dumps(seen))


asyncio.run(main())
