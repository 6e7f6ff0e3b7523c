"""The harness binds a Gym server's listening socket and hands it down (``--fd``): the server's
address is known when it is launched, so a whole stack starts at once, and a server that dies
refuses connections as one that bound its own port does."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rollcut.gym import ResourcesServe
from rollcut.testing import ServerProcess

from ..e2e.conftest import deploy


def test_a_server_launched_by_the_harness_has_its_address_before_it_serves_and_refuses_once_dead(
    nats_url: str, namespace: str
) -> None:
    srv = ServerProcess.serving(ResourcesServe(url=nats_url, namespace=namespace, env="counter"))
    try:
        srv.launch()
        url = srv.url
        assert url.startswith("http://127.0.0.1:") and not srv.pids  # known before it is ready
        with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as early:
            # connected before the server accepts: it waits in the backlog and is answered
            early.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            srv.ready()
            assert early.recv(64).startswith(b"HTTP/1.1 200")
        assert srv.url == url  # what the server printed is the address the harness bound
        port = srv.port
        srv.kill()
        with pytest.raises(ConnectionRefusedError):  # the harness kept no copy of the socket
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        srv.start()  # started again where it was, as a supervisor restarts it
        assert srv.port == port and httpx.get(f"{srv.url}/healthz", timeout=30).status_code == 200
    finally:
        srv.close()


def test_a_whole_stack_is_launched_before_any_of_it_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent is told the model's and environments' addresses at launch and the environment
    server the agent's: every process of the stack runs before the first is waited for."""
    waited: list[tuple[str, int]] = []
    ready = ServerProcess.ready

    def noting(self: ServerProcess) -> ServerProcess:
        waited.append((self.name, len(launched)))
        return ready(self)

    launched: list[ServerProcess] = []
    launch = ServerProcess.launch

    def counting(self: ServerProcess) -> ServerProcess:
        launched.append(self)
        return launch(self)

    monkeypatch.setattr(ServerProcess, "ready", noting)
    monkeypatch.setattr(ServerProcess, "launch", counting)
    with deploy(tmp_path) as dep:  # one agent worker, as every deployment of the suite
        names = [p.name for p in dep.stack]
        assert names == ["model", "counter", "blackjack", "workplace", "agent", "environment"]
        assert waited == [(name, len(names)) for name in names]  # all six launched before any wait
        env, agent = dep.stack[-1], dep.stack[-2]
        health = httpx.get(f"{env.url}/healthz", timeout=30)
        assert health.status_code == 200 and agent.alive()


def test_a_descriptor_that_is_not_a_listening_socket_is_refused_naming_it(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    not_a_socket = os.open(tmp_path / "file", os.O_RDWR | os.O_CREAT, 0o600)
    unbound = socket.socket()
    try:
        for fd, said in [(not_a_socket, "is not a TCP socket"), (unbound.fileno(), "is not listening")]:
            serve = [sys.executable, "-m", "rollcut", "serve", "resources", "counter", "--url", nats_url]
            done = subprocess.run(
                [*serve, "--namespace", namespace, "--fd", str(fd)],
                pass_fds=(fd,),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode != 0 and said in done.stderr, done.stderr[-2000:]
            assert "Traceback" not in done.stderr
    finally:
        os.close(not_a_socket)
        unbound.close()


def test_a_server_handed_an_ipv6_socket_says_an_address_a_client_can_use(
    nats_url: str, namespace: str
) -> None:
    argv = ["resources", "counter", "--url", nats_url, "--namespace", namespace]
    srv = ServerProcess(argv, listen=("::1", 0))  # the harness binds it and hands it down (--fd)
    try:
        srv.start()
        assert srv.url == f"http://[::1]:{srv.port}"  # bracketed, as a URL names an IPv6 host
        assert httpx.get(f"{srv.url}/healthz", timeout=30).status_code == 200
    finally:
        srv.close()
