"""Claude Code as an opaque agent: the ``claude`` CLI run once per attempt behind rollcut's relay.

The counterpart of NeMo Gym's ``claude_code_agent`` (which runs ``claude -p``
against a Gym model server): a separate program, importing nothing of
rollcut's, run as ``python CLAUDE_CODE_AGENT --claude PATH``. It reads its task
as JSON on stdin (``prompt``; optional ``model``, default ``rollcut-local``;
``max_turns``, default 4; ``tools``, Claude Code's built-in tools it may use,
default none; ``id``), runs

    claude -p --bare --no-session-persistence --output-format json
           --model MODEL --max-turns N --tools TOOLS -- PROMPT

with ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` as the launcher set them
(the relay, which forwards ``/v1/messages`` to the model server), and prints
``{"answer", "turns", "stop_reason", "is_error"}`` as one JSON line.

What it fixes so that two runs of one task send the same requests (replay
compares them, docs/opaque-agents.md):

- ``--bare``: no hooks, plugins, memory or CLAUDE.md discovery, so nothing of
  the machine's own Claude setup enters the system prompt;
- its working directory is ``$TMPDIR/rollcut-claude-<id>``, emptied first: the
  ``CWD:`` line of Claude Code's system prompt (and any path a tool reports) is
  then the same in every attempt; sandboxed, ``/tmp`` is the run's own;
- its config directory is inside it, and nothing is sent home: telemetry,
  error reports, update checks and other non-essential traffic are off.

What it cannot fix is declared on the agent server instead (``--normalise``):
the device and session ids Claude Code puts in ``metadata.user_id`` of every
request, and the date in its system prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_ENABLE_TELEMETRY": "0",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claude", required=True, help="The claude executable.")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    task = json.loads(sys.stdin.read())
    name = re.sub(r"[^A-Za-z0-9_-]", "_", str(task.get("id", "task")))[:64]
    work = os.path.join(tempfile.gettempdir(), f"rollcut-claude-{name}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work, mode=0o700)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": work,
        "CLAUDE_CONFIG_DIR": os.path.join(work, ".claude"),
        "ANTHROPIC_BASE_URL": os.environ["ANTHROPIC_BASE_URL"],
        "ANTHROPIC_API_KEY": os.environ.get("ANTHROPIC_API_KEY", "rollcut-relay"),
        **QUIET,
    }
    argv = [
        args.claude,
        "-p",
        "--bare",
        "--no-session-persistence",
        "--output-format",
        "json",
        "--model",
        str(task.get("model", "rollcut-local")),
        "--max-turns",
        str(int(task.get("max_turns", 4))),
        "--tools",
        str(task.get("tools", "")),
        "--",
        str(task["prompt"]),
    ]
    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=args.timeout)
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        sys.stderr.write(f"claude exited {done.returncode} without a result: {done.stderr[-2000:]}\n")
        return done.returncode or 1
    print(
        json.dumps(
            {
                "answer": result.get("result", ""),
                "turns": result.get("num_turns"),
                "stop_reason": result.get("stop_reason"),
                "subtype": result.get("subtype"),  # "success", or why it stopped ("error_max_turns")
                "is_error": bool(result.get("is_error")),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
