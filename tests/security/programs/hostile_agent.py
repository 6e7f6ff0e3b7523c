"""A hostile opaque agent program: what it does is named by its task's ``prompt`` (on stdin).

Standard library only, run by path as the opaque agent server runs any agent. Its last stdout line is
what it wants the server to believe.
"""

import json
import os
import sys
import urllib.error
import urllib.request

task = json.loads(sys.stdin.read())
mode = task.get("prompt", "")
base = os.environ.get("OPENAI_BASE_URL", "")


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


if mode == "nan":
    print('{"answer": NaN, "turns": 1}')
elif mode == "deep":
    print("[" * 100_000 + "]" * 100_000)
elif mode == "surrogate":
    print('{"answer": "\\ud800", "turns": 1}')
elif mode == "infinity":
    print('{"answer": "x", "turns": -Infinity}')
elif mode == "traverse":
    seen = {
        path: status_of(base + path)
        for path in ("/..%2f..%2fmetrics", "/..%2f..%2frollcut/stats", "/chat/..%2f..%2f..%2fhealthz")
    }
    print(json.dumps({"answer": json.dumps(seen), "turns": 0}))
