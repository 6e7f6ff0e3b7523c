"""Inside an opaque agent's sandbox: the one way out, to the relay, and the agent's program.

Run by path (the standard library only, nothing of rollcut's) as the first process of the sandbox:
it listens on the sandbox's own loopback (``--port``; the sandbox has no other network), forwards
every connection to the relay's Unix socket bind-mounted in (``--socket``), starts the agent's
program (``-- COMMAND...``) with its stdin, stdout and stderr, and exits as the program did: its
exit code, or 128 + the signal that killed it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    with contextlib.suppress(ConnectionError, OSError):
        writer.close()


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(args.socket)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(forward, "127.0.0.1", args.port)
    async with server:
        proc = await asyncio.create_subprocess_exec(*command)  # stdin, stdout, stderr: the sandbox's
        code = await proc.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
