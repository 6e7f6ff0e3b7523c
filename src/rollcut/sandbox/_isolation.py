"""An opaque agent's program runs outside the trust boundary: in a bubblewrap sandbox.

What the program gets (``docs/security.md`` has the threat table):

- its own pid, mount, IPC, UTS, user and network namespaces (``bwrap --unshare-all``): it sees no
  other process (its ``/proc`` is its own), and its only network is its own loopback;
- the system's directories (of ``/etc`` only what programs read to run) and the executable its
  command names with the installation it declares itself part of, read-only; a fresh ``/tmp``; a
  working directory of its own, the only place it can write;
- no file of rollcut's: not the credentials, the ledger, the token store or any server's home;
- one way out: ``127.0.0.1:<port>`` inside the sandbox, which ``sandbox_forward.py`` (its first
  process) forwards to this worker's relay over a Unix socket bind-mounted in. The bus is not
  reachable, and the relay answers the run only under its token;
- an environment holding nothing but its base URLs, its key and what a program needs to run
  (``PATH``, ``HOME``, ``LANG``): no ``ROLLCUT_*``, no ``NATS_*``, nothing of the server's.

Where bubblewrap is missing or cannot make namespaces, the opaque agent server refuses to start
unless told ``--unisolated`` (what that gives up is in ``docs/security.md``). The sandbox
environment's commands run in the same isolation, so it lives here, below both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigError

__all__ = ["FORWARDER", "READ_ONLY_ROOT", "SANDBOX_PORT", "Isolation"]

FORWARDER = Path(__file__).with_name("sandbox_forward.py")
"""The sandbox's first process (a program of its own, run by path)."""

SANDBOX_PORT = 8080
"""Where the relay is, from inside a sandbox (its own loopback)."""

RELAY_SOCKET = "/run/rollcut/relay.sock"
_ETC = tuple(
    f"/etc/{name}"
    for name in (
        # what programs read to run: the loader's paths, the system's alternatives (Debian's
        # /usr/bin/python3, awk, editor...), names of users and hosts, the time zone, certificates
        "alternatives",
        "ld.so.cache",
        "ld.so.conf",
        "ld.so.conf.d",
        "passwd",
        "group",
        "nsswitch.conf",
        "hosts",
        "host.conf",
        "localtime",
        "timezone",
        "os-release",
        "debian_version",
        "mime.types",
        "ssl/certs",
        "ssl/openssl.cnf",
        "ca-certificates",
        "python3",
        "python3.11",
    )
)
"""The host's ``/etc`` as far as a command needs it, never the whole of it: not ``shadow``, not
private keys, not the host's configuration of its services (issue 49, as root bubblewrap's uid
mapping would let the sandbox read what root reads)."""
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", *_ETC)
_KEPT_ENV = ("PATH", "LANG", "LC_ALL", "TZ")
READ_ONLY_ROOT = ("--remount-ro", "/")
"""The sandbox's own root, read-only once every mount is made (the last option before the command):
a program writes only where it was given a place, never into a directory made to hold a mount."""


def _probe(bwrap: str) -> str | None:
    """None if bubblewrap makes its namespaces here, else why not."""
    argv = [bwrap, "--unshare-all", "--die-with-parent", *_ro(_SYSTEM), "--proc", "/proc", "--", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap did not run: {exc}"
    return (
        None if done.returncode == 0 else f"bubblewrap cannot make its namespaces here: {done.stderr.strip()}"
    )


def _ro(paths: tuple[str, ...] | list[str]) -> list[str]:
    return [a for p in paths for a in ("--ro-bind-try", p, p)]


def _command_paths(command: list[str]) -> list[str]:
    """What the command needs to run, read-only: the Python the forwarder runs on (this venv and the
    Python it was made from), the executable (as named and as resolved) with the installation it
    declares itself part of, its script's interpreter likewise, and each file it names by absolute
    path: files, never the directories around them, which may hold a home or credentials."""
    out = [sys.prefix, sys.base_prefix, str(FORWARDER)]
    exe = Path(shutil.which(command[0]) or command[0])
    if exe.is_absolute():
        for f in dict.fromkeys([exe, exe.resolve(), *_interpreter(exe.resolve())]):
            out.append(str(f))
            out += [str(p) for p in [_installation(f)] if p is not None]
    out += [a for a in command[1:] if a.startswith("/") and Path(a).is_file()]
    kept = [
        p for p in dict.fromkeys(out) if p not in ("/", "") and not p.startswith(("/proc", "/sys", "/dev"))
    ]
    # a path inside another one bound is there already (and cannot be bound again: the mount is read-only)
    return [p for p in kept if not any(q != p and Path(p).is_relative_to(q) for q in kept)]


def _installation(exe: Path) -> Path | None:
    """The installation ``exe`` belongs to, where it says it is one: a virtual environment
    (``pyvenv.cfg``) or a package (``package.json``) in its directory or the one above; else None
    (a program in a plain ``<dir>/bin`` gets itself bound, not ``<dir>``: issue 49)."""
    for d in (exe.parent, exe.parent.parent):
        if d != d.parent and ((d / "pyvenv.cfg").is_file() or (d / "package.json").is_file()):
            return d
    return None


def _interpreter(exe: Path) -> list[Path]:
    """A script's interpreter named by absolute path on its ``#!`` line (``env`` looks on PATH)."""
    try:
        with exe.open("rb") as f:
            head = f.read(256)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    words = head[2:].split(b"\n", 1)[0].split()
    path = Path(words[0].decode(errors="replace")) if words else None
    if path is None or not path.is_absolute() or path.name == "env":
        return []
    return [path, path.resolve()]


@dataclass(frozen=True)
class Isolation:
    """How a worker sandboxes its agent programs (found once, at start)."""

    bwrap: str

    @classmethod
    def find(cls, what: str = "an opaque agent's program runs sandboxed") -> Isolation:
        """bubblewrap, if it works here; else a :class:`ConfigError` saying why (``what`` needs it)
        and what to do."""
        bwrap = shutil.which("bwrap")
        why = (
            "bubblewrap (bwrap) is not installed (Debian: apt-get install bubblewrap)" if not bwrap else None
        )
        why = why or _probe(str(bwrap))
        if why:
            raise ConfigError(
                f"{what}, and {why}; start with --unisolated to run it "
                "without (it can then read what the server's user can: docs/security.md)"
            )
        return cls(str(bwrap))

    def confined(self, read_only: list[str]) -> list[str]:
        """bubblewrap's part every sandbox shares: every namespace its own, gone with its parent, a
        fresh ``/proc``, ``/dev`` and ``/tmp``, then the system's directories and ``read_only``
        bound read-only (after the fresh ``/tmp``: a venv or a script under /tmp stays visible)."""
        return [
            self.bwrap,
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            *_ro(list(_SYSTEM) + read_only),
        ]

    def argv(self, command: list[str], *, socket: Path, workdir: Path) -> list[str]:
        """The command line that runs ``command`` sandboxed, reaching the relay at ``socket``."""
        return [
            *self.confined(_command_paths(command)),
            "--dir",
            "/run/rollcut",
            "--bind",
            str(socket),
            RELAY_SOCKET,
            "--bind",
            str(workdir),
            str(workdir),
            "--chdir",
            str(workdir),
            "--setenv",
            "HOME",
            str(workdir),
            *READ_ONLY_ROOT,
            "--",
            sys.executable,
            str(FORWARDER),
            "--socket",
            RELAY_SOCKET,
            "--port",
            str(SANDBOX_PORT),
            "--",
            *command,
        ]

    @staticmethod
    def available() -> bool:
        """Whether agent programs can be sandboxed here (the demo and the benchmarks sandbox them
        when they can, and say when they cannot)."""
        bwrap = shutil.which("bwrap")
        return bwrap is not None and _probe(bwrap) is None

    @staticmethod
    def environment(base: dict[str, str]) -> dict[str, str]:
        """What a sandboxed program's environment holds besides its URLs: the bare minimum to run."""
        return {k: os.environ[k] for k in _KEPT_ENV if k in os.environ} | base
