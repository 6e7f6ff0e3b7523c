"""A hostile opaque agent program: what it does is named by its task's ``prompt`` (on stdin).

Standard library only, run by path as the opaque agent server runs any agent. Its last stdout line is
what it wants the server to believe.
"""

import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request

task = json.loads(sys.stdin.read())
mode = task.get("prompt", "")
base = os.environ.get("OPENAI_BASE_URL", "")


def status_of(url: str, body: bytes | None = None) -> int:
    try:
        req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def contents(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def connects(url: str) -> bool:
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        return True
    except OSError:
        return False


def escape() -> dict[str, object]:
    """Everything a hostile program tries: its parent's command line, the credentials, the bus,
    other processes' environments, and another rollout's attempt through the relay."""
    found: dict[str, object] = {}
    parent = f"/proc/{os.getppid()}/cmdline"
    found["parent_cmdline_names_credentials"] = b"credentials" in contents(parent)
    found["credentials_readable"] = bool(contents(task["credentials"]))
    found["bus_reachable"] = connects(task["bus"])
    others = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            env = contents(f"/proc/{pid}/environ")
            if b"OPENAI_BASE_URL" in env and f"OPENAI_BASE_URL={base}".encode() not in env:
                others.append(pid)  # another run's base URL: its rollout, attempt and token
    found["other_agent_environments"] = len(others)
    found["processes_seen"] = sum(1 for p in os.listdir("/proc") if p.isdigit())
    victim = task["victim"]
    own_token = base.rstrip("/").split("/")[-2]  # .../r/<rollout>/<attempt>/<token>/v1
    root = base.split("/r/")[0]
    body = json.dumps({"model": "rollcut-local", "messages": [{"role": "user", "content": "x"}]}).encode()
    found["as_victim_with_own_token"] = status_of(
        f"{root}/r/{victim}/1/{own_token}/v1/chat/completions", body
    )
    found["as_victim_without_token"] = status_of(f"{root}/r/{victim}/1/v1/chat/completions", body)
    return found


if mode == "nan":
    print('{"answer": NaN, "turns": 1}')
elif mode == "deep":
    print("[" * 100_000 + "]" * 100_000)
elif mode == "surrogate":
    print('{"answer": "\\ud800", "turns": 1}')
elif mode == "infinity":
    print('{"answer": "x", "turns": -Infinity}')
elif mode == "sleep":
    time.sleep(float(task.get("seconds", 20)))
    print(json.dumps({"answer": "slept", "turns": 0}))
elif mode == "escape":
    print(json.dumps({"answer": json.dumps(escape()), "turns": 0}))
elif mode == "traverse":
    seen = {
        path: status_of(base + path)
        for path in ("/..%2f..%2fmetrics", "/..%2f..%2frollcut/stats", "/chat/..%2f..%2f..%2fhealthz")
    }
    print(json.dumps({"answer": json.dumps(seen), "turns": 0}))
