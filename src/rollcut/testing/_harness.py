"""Process supervision: start Gym servers as processes, wait until they serve, SIGKILL, restart.

One harness for ``rollcut demo``, the end-to-end tests and any deployment
script: a server is started from its :class:`~rollcut.gym.ServeOptions`
(through the real command line, ``rollcut serve ...``), it is ready when it
printed its readiness lines, and a crash is SIGKILL of every process of it.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from .._errors import ServerStartError
from .._files import private_dir
from .._process import http_url, kill_group, lifeline, listener, pid_alive, sweep_all_dead_dirs, temp_dir
from ..bus import role_file
from ..gym import AgentServe, EnvironmentServe, ModelServe, ResourcesServe, ServeSpec, cli_argv

__all__ = ["DEMO_ENVIRONMENTS", "ServerProcess", "start_stack", "stop_stack"]

DEMO_ENVIRONMENTS = ("counter", "blackjack", "workplace")
"""The resources servers :func:`start_stack` runs unless told otherwise."""


class ServerProcess:
    """One server (a parent and its workers) started as processes and watched by its readiness lines.

    ``argv`` follows ``command`` (default ``python -m rollcut serve``); the server
    is ready once it printed ``LISTENING <url>`` and one ``READY <instance>
    pid=<pid>`` per worker.
    """

    def __init__(
        self,
        argv: list[str],
        workers: int = 1,
        logs: Path | None = None,
        command: list[str] | None = None,
        *,
        listen: tuple[str, int] | None = None,
    ) -> None:
        self.argv, self.workers, self.logs = argv, workers, logs
        # (host, port) this harness binds and hands the server as ``--fd`` at each start: its url is
        # known at launch, so whoever needs its address starts beside it (see :func:`start_stack`);
        # after the first start the port it got, as a supervisor restarts a server where it was
        self.listen = listen
        # a resources server is named by its environment, or by the server it fronts (nemo-gym NAME)
        # its positionals (kind, then its environment or agent, then the server it fronts); a resources
        # server is named by the last of them (nemo-gym NAME: NAME), every other by its kind
        self.positionals = list(itertools.takewhile(lambda a: not a.startswith("-"), argv))
        last = self.positionals[-1] if argv[:1] == ["resources"] else None
        self.name = last or (argv[0] if argv else "")
        self.command = command or [sys.executable, "-m", "rollcut", "serve"]
        self.p: subprocess.Popen[str] | None = None
        self.temp_dir = temp_dir()  # where its processes make their directories (set again at start)
        self.url = ""
        self.pids: list[int] = []
        self.instances: dict[str, int] = {}  # worker instance name -> pid
        self.log_path: Path | None = None

    @classmethod
    def serving(cls, opts: ServeSpec, logs: Path | None = None) -> ServerProcess:
        """The process ``rollcut serve`` runs for ``opts`` (not started yet), on a listening socket
        this harness binds (``--fd``) unless ``opts`` names one."""
        listen = (opts.host, opts.port) if opts.fd is None else None
        return cls(cli_argv(opts), workers=opts.workers, logs=logs, listen=listen)

    @property
    def port(self) -> int:
        """The port it listens on (once started)."""
        return int(self.url.rsplit(":", 1)[1])

    def alive(self) -> bool:
        """Whether the parent and every worker still run."""
        return self.p is not None and self.p.poll() is None and all(pid_alive(pid) for pid in self.pids)

    def peak_rss_mb(self) -> float:
        """The largest peak resident memory (VmHWM) of any one of its processes, in MB (0 if gone)."""
        peak = 0
        for pid in [self.p.pid] if self.p else []:
            peak = max(peak, _vm_hwm_kb(pid))
        for pid in self.pids:
            peak = max(peak, _vm_hwm_kb(pid))
        return round(peak / 1024, 1)

    def tail(self) -> str:
        """The end of its log, to say why it died."""
        return self.log_path.read_text()[-1500:] if self.log_path and self.log_path.exists() else ""

    def start(self) -> ServerProcess:
        """Start it and return once every worker serves; raises ServerStartError with its log if not."""
        return self.launch().ready()

    def launch(self) -> ServerProcess:
        """Start its processes without waiting for them (several servers start side by side)."""
        err: IO[str] | int = subprocess.DEVNULL
        if self.logs is not None:
            private_dir(self.logs)  # a server's log may quote prompts and tool results: user data
            name = "-".join(self.positionals)
            self.log_path = self.logs / f"{name}.log"
            err = os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a")
        # its own process group: a crash is one SIGKILL to the group, which also reaches a worker
        # its parent restarted since (whose pid this harness may not have read yet)
        self.temp_dir = temp_dir()  # where its processes make their directories
        argv, sock = self.argv, None
        if self.listen is not None:
            host, port = self.listen
            try:
                sock = _listener(host, port)
            except OSError as exc:
                raise ServerStartError(
                    f"rollcut serve {self.argv[0]}: cannot listen on {host}:{port}: {exc}"
                ) from exc
            self.listen = (host, int(sock.getsockname()[1]))
            self.url = http_url(host, self.listen[1])
            argv = [*argv, "--fd", str(sock.fileno())]
        try:
            self.p = subprocess.Popen(
                [*self.command, *argv],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                start_new_session=True,
                preexec_fn=lifeline(),  # a test process that dies takes its servers with it
                pass_fds=() if sock is None else (sock.fileno(),),
            )
        finally:
            if sock is not None:  # the server's alone: once it dies, a connection is refused
                sock.close()
        self.pids, self.instances = [], {}
        return self

    def ready(self) -> ServerProcess:
        """Return once every worker serves (see :meth:`launch`)."""
        assert self.p is not None and self.p.stdout is not None
        while True:
            line = self.p.stdout.readline().strip()
            if not line:
                raise ServerStartError(f"rollcut serve {self.argv[0]} did not start: {self.tail()}")
            if line.startswith("LISTENING"):
                self.url = line.split()[1]
            elif line.startswith("READY") and "pid=" in line:
                self.pids.append(int(line.rsplit("pid=", 1)[1]))
                self.instances[line.split()[1]] = self.pids[-1]
            if len(self.pids) == self.workers and (self.workers == 1 or line.startswith("READY http")):
                return self

    def close(self) -> None:
        """Stop it for good: SIGKILL, then remove what a SIGKILLed server leaves in the temporary
        directory (its workers' sockets and metrics, a relay's directory: named for dead processes,
        :func:`~rollcut._process.sweep_all_dead_dirs`). Every teardown uses this; :meth:`kill` is
        the crash, which leaves them as a real one does."""
        self.kill()
        sweep_all_dead_dirs(self.temp_dir)

    def kill(self) -> None:
        """SIGKILL every process of it at once (its process group); waits for the parent."""
        if self.p is not None:
            kill_group(self.p.pid)
            self.p.wait()
        for pid in self.pids:  # a worker that left the group (it never does) goes too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def kill_worker(self, instance: str) -> int:
        """SIGKILL one worker (``<group>-w<i>``) and return once its parent started it again; returns
        the new pid. Raises ServerStartError if the parent says nothing more (it died too)."""
        os.kill(self.instances[instance], signal.SIGKILL)
        assert self.p is not None and self.p.stdout is not None
        while True:
            line = self.p.stdout.readline().strip()
            if not line:
                raise ServerStartError(f"{instance} was not restarted: {self.tail()}")
            if line.startswith(f"RESTARTED {instance} ") and "pid=" in line:
                pid = int(line.rsplit("pid=", 1)[1])
                self.pids = [pid if p == self.instances[instance] else p for p in self.pids]
                self.instances[instance] = pid
                return pid


def _address(server: ServerProcess) -> str:
    """A launched server's url: known at once when this harness bound its socket, so whoever needs
    it starts beside it; else (a launcher whose servers bind their own) once it is ready."""
    return server.url or server.ready().url


def _listener(host: str, port: int, patience_s: float = 10.0) -> socket.socket:
    """:func:`~rollcut._process.listener`, asked again while the port is in use: a server started
    again where it was (a supervisor's restart) may find its SIGKILLed predecessor's workers still
    exiting, holding the socket for a moment. Any other error, or the port still held after
    ``patience_s``, is raised."""
    give_up = time.monotonic() + patience_s
    while True:
        try:
            return listener(host, port)
        except OSError as exc:
            if port == 0 or exc.errno != errno.EADDRINUSE or time.monotonic() >= give_up:
                raise
        time.sleep(0.05)  # the dying processes say nothing when they are gone: asked again


def _vm_hwm_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def start_stack(
    url: str,
    credentials: Path | None,
    tokens: Path,
    *,
    namespace: str,
    seed: int = 0,
    ports: dict[str, int] | None = None,
    logs: Path | None = None,
    token_delay: float = 0.002,
    tool_turns: int = 3,
    agent_workers: int = 2,
    workers: int | None = None,
    return_token_ids: bool = True,
    envs: tuple[str, ...] = DEMO_ENVIRONMENTS,
    model_options: dict[str, Any] | None = None,
    agent_options: dict[str, Any] | None = None,
    resources_options: dict[str, Any] | None = None,
    environment_options: dict[str, Any] | None = None,
    replicas: int = 1,
    launcher: Callable[[ServeSpec, Path | None], ServerProcess] = ServerProcess.serving,
    environment: bool = True,
) -> list[ServerProcess]:
    """The demo deployment, each server its own process: the local model, one resources server per
        environment in ``envs``, the Simple Agent and the environment server, in that order (each
        process's ``name`` is its kind, or its environment). ``ports`` pins a server's port by name (a
        supervisor restarting on the same ports). ``workers`` sets every server's worker count (else
        the agent has ``agent_workers`` and the rest one). ``model_options`` adds model-server options (an
        engine backend: ``{"backend": "engine", "upstream": URL}``), ``agent_options`` agent-server options
    (an opaque agent: ``{"agent": "opaque", "command": ..., "capability": "replayable_egress"}``),
    ``resources_options`` every resources server's (``{"replayable": True}`` for NeMo Gym's),
    ``environment_options`` the environment server's (``{"name": ...}``: two stacks on one bus).
    ``launcher`` makes each server's process from its options (``bench e2e --way plain`` runs the same
    servers without custody); without ``environment`` there is no environment server (the agent is last)."""
    ports = ports or {}
    common: dict[str, Any] = {"url": url, "namespace": namespace, "replicas": replicas}

    def of(role: str) -> dict[str, Any]:  # each server gets its own role's credentials, no other's
        return {**common, "credentials": str(role_file(credentials, role)) if credentials else ""}

    each: dict[str, Any] = {"workers": workers} if workers is not None else {}

    launched: list[ServerProcess] = []

    def launch(opts: ServeSpec) -> ServerProcess:
        launched.append(launcher(opts, logs).launch())
        return launched[-1]

    model_fields = dict(model_options or {})
    backend_options: dict[str, str] = model_fields.pop("backend_options", {})
    if model_fields.get("backend", "local") == "local":  # seed, token_delay and tool_turns are its options
        local = {"seed": seed, "token_delay": token_delay, "tool_turns": tool_turns}
        backend_options = {**{k: str(v) for k, v in local.items()}, **backend_options}

    def build() -> list[ServerProcess]:
        model = launch(
            ModelServe(
                **of("model"),
                port=ports.get("model", 0),
                tokens=str(tokens),
                return_token_ids=return_token_ids,  # the rows a collection writes are training data
                **each,
                **model_fields,
                backend_options=backend_options,
            )
        )
        servers: dict[str, ServerProcess] = {}
        for spec in envs:  # "nemo-gym:NAME": NeMo Gym's server NAME behind rollcut's journal, named NAME
            env, _, server = spec.partition(":")
            name = server or env
            servers[name] = launch(
                ResourcesServe(
                    **of("resources"),
                    env=env,
                    server=server,
                    port=ports.get(name, 0),
                    **each,
                    **(resources_options or {}),
                )
            )
        # the agent is launched with the addresses of the servers before it, the environment server
        # with the agent's: at once where this harness bound their sockets (:func:`_address`)
        agent = launch(
            AgentServe(
                **of("agent"),
                model=_address(model),
                resources={n: _address(p) for n, p in servers.items()},
                workers=workers or agent_workers,
                port=ports.get("agent", 0),
                **(agent_options or {}),
            )
        )
        stack = [model, *servers.values(), agent]
        if environment:
            stack.append(
                launch(
                    EnvironmentServe(
                        **of("environment"),
                        agent=_address(agent),
                        port=ports.get("environment", 0),
                        **each,
                        **(environment_options or {}),
                    )
                )
            )
        for p in stack:
            if not p.pids:  # not waited for above (a ready server has said its workers' pids)
                p.ready()
        return stack

    try:
        return build()
    except BaseException:
        for p in launched:  # nothing half-started is left running, nor what it left
            p.close()
        raise


def stop_stack(stack: list[ServerProcess]) -> None:
    """:meth:`ServerProcess.close` every server of ``stack``: a SIGKILLed server runs no cleanup, and
    the next server to start would reap what it left only if one starts."""
    for p in stack:
        p.close()
