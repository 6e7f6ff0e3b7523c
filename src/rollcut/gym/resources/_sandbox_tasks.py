"""The sandbox's tasks: a file tree to start from, a prompt, and the command that checks the work.

Bundled, of the kinds agentic RL trains on (SWE-Gym, R2E-Gym, terminal tasks, in miniature): make
a failing test pass in a tiny Python package, produce a file by shell, fix a config. A task may
also come inline with a row (``files`` and ``check``), bounded; its paths may not leave the tree.
The check runs isolated like any command, with the Python rollcut runs on (``python3``) and the
system's tools; a task's tests use ``unittest``, so nothing needs installing.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

import msgspec

from ..wire import ErrorKind, GymError

__all__ = ["TASKS", "Task", "task_of"]

MAX_TASK_FILES = 1000
MAX_TASK_BYTES = 256 << 10
"""An inline task, encoded (files, prompt and check): the seeding record holds the row's seed and
the task's tree as seeded, and one record holds at most 1 MiB (NATS' payload), so a task of this
size is restorable, not only accepted (issue 49)."""


class Task(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A sandbox task (schema 1): its files (path -> text), prompt and check command."""

    name: str
    prompt: str
    files: dict[str, str]
    check: str
    check_timeout_s: float = 60.0
    schema: int = 1

    def write(self, root: Path) -> None:
        for path, text in sorted(self.files.items()):
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task(
            name="fix_add",
            prompt="The test in test_calc.py fails. Fix the calc package so that it passes.",
            files={
                "calc/__init__.py": "def add(a, b):\n    return a - b\n",
                "test_calc.py": (
                    "import unittest\n\nfrom calc import add\n\n\n"
                    "class TestAdd(unittest.TestCase):\n"
                    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n\n"
                    "if __name__ == '__main__':\n    unittest.main()\n"
                ),
            },
            check="python3 -m unittest -q test_calc",
        ),
        Task(
            name="hello_file",
            prompt="Using the shell, create out.txt containing exactly the line: hello sandbox",
            files={"README.md": "Write out.txt.\n"},
            check="test \"$(cat out.txt)\" = 'hello sandbox'",
        ),
        Task(
            name="fix_config",
            prompt="config.json must set port to the number 8080 and keep debug as it is.",
            files={"config.json": '{"port": "eighty", "debug": true}\n'},
            check=(
                "python3 -c \"import json; c = json.load(open('config.json')); "
                "assert c == {'port': 8080, 'debug': True}, c\""
            ),
        ),
    )
}


def _bad(message: str) -> GymError:
    return GymError(ErrorKind.BAD_REQUEST, f"sandbox: {message}")


def task_of(args: dict[str, Any]) -> Task:
    """The task a session is seeded from: ``{"task": NAME}`` (bundled) or ``{"files": {...},
    "check": "...", "prompt": "..."}`` (inline, bounded)."""
    if "files" not in args:
        name = args.get("task", "fix_add")
        if not isinstance(name, str) or name not in TASKS:
            raise _bad(f"no bundled task {name!r} (there are {sorted(TASKS)})")
        return TASKS[name]
    files, check = args.get("files"), args.get("check")
    if not isinstance(files, dict) or not isinstance(check, str) or not check:
        raise _bad("an inline task needs files (path -> text) and a check command")
    if len(files) > MAX_TASK_FILES:
        raise _bad(f"an inline task holds at most {MAX_TASK_FILES} files")
    for path, text in files.items():
        normal = isinstance(path, str) and path and "\x00" not in path and posixpath.normpath(path) == path
        if not normal or path in (".", "..") or path.startswith(("/", "../")) or not isinstance(text, str):
            raise _bad(f"the task file {path!r} is not a text file inside the tree")
    dirs = {d for p in files for d in _ancestors(p)}
    if clash := sorted(dirs & set(files)):
        raise _bad(f"the task names {clash[0]!r} both as a file and as a directory")
    task = Task(
        name=str(args.get("name", "inline")), prompt=str(args.get("prompt", "")), files=files, check=check
    )
    if len(msgspec.json.encode(task)) > MAX_TASK_BYTES:
        raise _bad(f"an inline task holds at most {MAX_TASK_BYTES} bytes (files, prompt and check, encoded)")
    return task


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]
