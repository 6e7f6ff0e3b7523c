"""Hosts of the project's own: network namespaces on one bridge, made by the test and removed after.

Each host is a network namespace with one address on a private /24, joined to a bridge in this
(root) namespace through a veth pair; the root namespace has the bridge's own address, so the test
itself and whatever it runs here (the collector, the Gym servers) form one more host. Processes
start on a host under ``ip netns exec``. Faults are the network's, not the processes':

- :meth:`Hosts.cut` takes a host's link down: nobody reaches it, it reaches nobody;
- :meth:`Hosts.block` drops what one host sends to another (a blackhole route in the sender's
  namespace), the other direction untouched: an asymmetric split;
- :meth:`Hosts.cut_off_here` blackholes every host from the root namespace: this host (the
  collector's) loses the cluster while the cluster keeps itself;
- :meth:`Hosts.shape` makes the link between two hosts (or a host and this one) lossy, slow,
  reordering, duplicating or narrow, each way, changed at any time (:mod:`._shaper`: TUN devices
  and a user-space shaper, this kernel having no netem).

Only the namespaces, links and routes made here are ever touched; their names carry a random tag,
so two runs on one machine never meet. Needs root and iproute2 (``ip``), as in CI
(:func:`hosts_possible` says why not, where not).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from ..bus import BusConfig, Credentials, EmbeddedCluster, EventLog
from ..bus._cluster import ClusterLayout, ClusterNode
from ._linkshape import LinkShape

__all__ = ["Hosts", "hosts_possible", "netns_cluster", "stream_leader"]


def hosts_possible() -> str | None:
    """None where hosts can be made here, else why not."""
    if shutil.which("ip") is None:
        return "no `ip` (Debian's iproute2) on PATH"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return None


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *args] if ns is None else ["ip", "netns", "exec", ns, "ip", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


class Hosts:
    """Namespaces ``names`` on a bridge; a context manager that removes all it made."""

    def __init__(self, names: list[str]) -> None:
        tag = secrets.token_hex(3)
        net = f"10.{random.randint(64, 250)}.{random.randint(1, 250)}"
        self.bridge = f"rcb{tag}"
        self.here = f"{net}.254"
        self.ns = {name: f"rc{tag}-{name}" for name in names}
        self.addr = {name: f"{net}.{i + 1}" for i, name in enumerate(names)}
        self._port = {name: f"rc{tag}p{i}" for i, name in enumerate(names)}
        self._blocked: set[tuple[str | None, str]] = set()
        self._tag = tag
        self._shaper: subprocess.Popen[str] | None = None
        # a shaped link, each way round: (the sender's TUN device, the receiver's)
        self._links: dict[tuple[str | None, str | None], tuple[str, str]] = {}

    def __enter__(self) -> Hosts:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.here}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for name, ns in self.ns.items():
                port, inside = self._port[name], "eth0"
                _ip("netns", "add", ns)
                _ip("link", "add", port, "type", "veth", "peer", "name", f"{port}x")
                _ip("link", "set", f"{port}x", "netns", ns)
                _ip("link", "set", f"{port}x", "name", inside, ns=ns)
                _ip("addr", "add", f"{self.addr[name]}/24", "dev", inside, ns=ns)
                _ip("link", "set", inside, "up", ns=ns)
                _ip("link", "set", "lo", "up", ns=ns)
                _ip("link", "set", port, "master", self.bridge)
                _ip("link", "set", port, "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._shaper is not None:  # its devices go with it, and the routes through them
            self._shaper.kill()
            self._shaper.wait()
        for src, dst in list(self._blocked):
            with contextlib.suppress(RuntimeError):
                self.unblock(src, dst)
        for ns in self.ns.values():  # its end of the veth pair goes with it, and the other end too
            with contextlib.suppress(RuntimeError):
                _ip("netns", "del", ns)
        with contextlib.suppress(RuntimeError):
            _ip("link", "del", self.bridge)

    def on(self, name: str) -> list[str]:
        """The command prefix that runs a program on host ``name``."""
        return ["ip", "netns", "exec", self.ns[name]]

    def cut(self, name: str) -> None:
        _ip("link", "set", self._port[name], "down")

    def heal(self, name: str) -> None:
        _ip("link", "set", self._port[name], "up")

    def block(self, src: str | None, dst: str) -> None:
        """Drop everything host ``src`` (None: the root namespace) sends to host ``dst``."""
        _ip("route", "add", "blackhole", f"{self.addr[dst]}/32", ns=self._inside(src))
        self._blocked.add((src, dst))

    def unblock(self, src: str | None, dst: str) -> None:
        _ip("route", "del", "blackhole", f"{self.addr[dst]}/32", ns=self._inside(src))
        self._blocked.discard((src, dst))

    def links(self) -> list[tuple[str | None, str]]:
        """Every link a fault can shape: each pair of hosts, and each host with this one (None)."""
        names = list(self.ns)
        return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]] + [(None, n) for n in names]

    def shape(self, a: str | None, b: str | None, there: LinkShape, back: LinkShape | None = None) -> None:
        """Shape what host ``a`` sends to host ``b`` by ``there`` and what ``b`` sends back by
        ``back`` (default: the same); None is this (the root) namespace. The first call on a pair
        routes it through the shaper; later ones change its shape at once."""
        tuns = self._links.get((a, b)) or self._link(a, b)
        self._ask({"op": "shape", "from": tuns[0], "shape": msgspec.to_builtins(there)})
        self._ask({"op": "shape", "from": tuns[1], "shape": msgspec.to_builtins(back or there)})

    def shaper_counts(self) -> dict[str, int]:
        """What the shaper did so far: packets read, dropped, duplicated and written."""
        answer = self._ask({"op": "counts"})
        return {k: int(v) for k, v in answer.items() if k != "ok"}

    def _inside(self, name: str | None) -> str | None:
        """Host ``name``'s namespace; None (this one) for None."""
        return None if name is None else self.ns[name]

    def _address(self, name: str | None) -> str:
        return self.here if name is None else self.addr[name]

    def _link(self, a: str | None, b: str | None) -> tuple[str, str]:
        """A TUN device at each end, paired in the shaper, and at each end a /32 route to the other
        through it (more specific than the bridge's /24). Killing the shaper removes the devices,
        and their routes with them."""
        i = len(self._links) // 2
        tuns = (f"rs{self._tag}{i}a", f"rs{self._tag}{i}b")
        for end, tun in zip((a, b), tuns, strict=True):
            self._ask({"op": "tun", "ns": self._inside(end), "name": tun})
            _ip("link", "set", tun, "up", ns=self._inside(end))
        self._ask({"op": "pair", "x": tuns[0], "y": tuns[1]})
        for src, dst, tun in ((a, b, tuns[0]), (b, a, tuns[1])):
            to, where = self._address(dst), self._address(src)
            _ip("route", "add", f"{to}/32", "dev", tun, "src", where, ns=self._inside(src))
        self._links[(a, b)], self._links[(b, a)] = tuns, (tuns[1], tuns[0])
        return tuns

    def _ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self._shaper is None:
            self._shaper = subprocess.Popen(
                [sys.executable, "-m", "rollcut.testing._shaper", str(random.randrange(2**32))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            self._read()
        assert self._shaper.stdin is not None
        self._shaper.stdin.write(json.dumps(msg) + "\n")
        self._shaper.stdin.flush()
        answer = self._read()
        if not answer.get("ok"):
            raise RuntimeError(f"the link shaper refused {msg}: {answer.get('error')}")
        return answer

    def _read(self) -> dict[str, Any]:
        assert self._shaper is not None and self._shaper.stdout is not None
        line = self._shaper.stdout.readline()
        if not line:
            raise RuntimeError(f"the link shaper exited ({self._shaper.poll()})")
        out: dict[str, Any] = json.loads(line)
        return out

    @contextlib.contextmanager
    def cut_off_here(self) -> Iterator[None]:
        """The root namespace (the collector's host) reaches no host while inside."""
        for name in self.ns:
            self.block(None, name)
        try:
            yield
        finally:
            for name in self.ns:
                self.unblock(None, name)


def netns_cluster(hosts: Hosts, data_dir: Path, credentials: Credentials) -> EmbeddedCluster:
    """A cluster with one node on each host (not started): nodes on their host's address, on the
    standard ports, each process started under ``ip netns exec``."""
    names = list(hosts.ns)
    ClusterLayout(
        nodes=[ClusterNode(name=n, host=hosts.addr[n], client_port=4222, route_port=6222) for n in names],
        route_password=secrets.token_urlsafe(24),
    ).save(data_dir / "cluster.json")
    cluster = EmbeddedCluster(data_dir, size=len(names), credentials=credentials)
    for node in cluster.nodes:
        node.wrap = hosts.on(node.name)
    return cluster


def stream_leader(cluster: EmbeddedCluster, creds: Credentials, timeout_s: float = 60.0) -> Any:
    """The node that leads the namespace's stream now (after an election, the new one), asked until
    one answers for up to ``timeout_s``."""

    async def ask() -> str:
        log = await EventLog.connect(BusConfig(url=cluster.url).as_role(creds, "admin"))
        try:
            info = await log.nc.jetstream(timeout=2).stream_info(log.stream)
            return str(info.cluster.leader or "") if info.cluster else ""
        finally:
            await log.close()

    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        with contextlib.suppress(Exception):  # no leader yet: the request is not answered
            if name := asyncio.run(ask()):
                return cluster.node(name)
        time.sleep(0.2)  # an election under way: nothing to wait on but asking again
    raise TimeoutError(f"no stream leader within {timeout_s:.0f} s")
