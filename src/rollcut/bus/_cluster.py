"""A JetStream cluster of nats-server processes: on loopback for tests and one machine, or as the
configs of a deployment (``rollcut nats --cluster``, ``docker/compose.yaml``).

Why a cluster is rollcut's answer to outgrowing one machine: the stream's one total order and its
server-side fencing are what every guarantee rests on, and a replicated stream keeps both (the
stream leader orders and checks every write; an ack means a quorum stored it) while surviving the
loss of a node. Nothing in rollcut changes but the URL list and the replica count.

Every node's config is written by :func:`node_config`, from one :class:`ClusterLayout` (names,
addresses, ports, the route password) kept 0600 beside the nodes, so a node restarted after a
crash comes back on the same ports with the same peers. Routes between nodes authenticate with
that password; clients authenticate with the per-role nkeys of ``credentials.json``.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Self

import msgspec

from .._errors import ConfigError
from .._files import private_dir, read_record, write_private
from .._process import free_port
from ._auth import Credentials
from ._server import EmbeddedServer, server_config

__all__ = ["ClusterLayout", "ClusterNode", "EmbeddedCluster", "embedded_nats", "node_config"]

ROUTE_USER = "route"


class ClusterNode(msgspec.Struct, frozen=True, kw_only=True):
    """One nats-server of a cluster: its name, where clients and peers reach it."""

    name: str
    host: str
    client_port: int
    route_port: int


class ClusterLayout(msgspec.Struct, frozen=True, kw_only=True):
    """Who is in the cluster and how its nodes find each other (stored 0600: it holds the route
    password)."""

    schema_version: int = 1
    name: str = "rollcut"
    nodes: list[ClusterNode]
    route_password: str

    @classmethod
    def loopback(cls, size: int, *, base_port: int = 0, host: str = "127.0.0.1") -> ClusterLayout:
        """``size`` nodes on ``host``: client ports from ``base_port`` up (0: free ones), route
        ports free."""
        if size < 1:
            raise ConfigError(f"a cluster needs at least one node, not {size}")
        nodes = [
            ClusterNode(
                name=f"n{i + 1}",
                host=host,
                client_port=base_port + i if base_port else free_port(host),
                route_port=free_port(host),
            )
            for i in range(size)
        ]
        return cls(nodes=nodes, route_password=secrets.token_urlsafe(24))

    @classmethod
    def named(cls, hosts: list[str], *, client_port: int = 4222, route_port: int = 6222) -> ClusterLayout:
        """One node per host name, each on the standard ports (a compose network, a Slurm
        allocation)."""
        nodes = [ClusterNode(name=h, host=h, client_port=client_port, route_port=route_port) for h in hosts]
        return cls(nodes=nodes, route_password=secrets.token_urlsafe(24))

    @property
    def urls(self) -> str:
        """Every node's client URL, comma-separated: what ``--url`` takes."""
        return ",".join(f"nats://{n.host}:{n.client_port}" for n in self.nodes)

    def save(self, path: Path) -> None:
        private_dir(path.parent)
        write_private(path, msgspec.json.encode(self))

    @classmethod
    def load(cls, path: Path) -> ClusterLayout:
        return read_record(path, cls, "cluster layout")


def node_config(
    layout: ClusterLayout,
    index: int,
    *,
    store_dir: str,
    credentials: Credentials | None,
    sync_interval: str | None = None,
    listen_host: str | None = None,
    extra: str = "",
) -> str:
    """The config of node ``index``: JetStream, the role credentials, and its routes to the others.

    ``listen_host`` is where it binds (default: its own host; ``0.0.0.0`` in a container).
    """
    node = layout.nodes[index]
    bind = listen_host or node.host
    routes = [
        f'"nats-route://{ROUTE_USER}:{layout.route_password}@{peer.host}:{peer.route_port}"'
        for peer in layout.nodes
        if peer.name != node.name
    ]
    cluster = "\n".join(
        [
            f'server_name: "{node.name}"',
            "cluster {",
            f'  name: "{layout.name}"',
            f'  listen: "{bind}:{node.route_port}"',
            f'  authorization {{ user: "{ROUTE_USER}", password: "{layout.route_password}" }}',
            f"  routes: [{', '.join(routes)}]",
            "}",
        ]
    )
    return server_config(
        listen=f"{bind}:{node.client_port}",
        store_dir=store_dir,
        sync_interval=sync_interval,
        credentials=credentials,
        extra=cluster + "\n" + extra,
    )


class _Node(EmbeddedServer):
    """A cluster node: an embedded server whose config is its node's."""

    def __init__(self, cluster: EmbeddedCluster, index: int) -> None:
        node = cluster.layout.nodes[index]
        super().__init__(
            cluster.data_dir / node.name,
            host=node.host,
            port=node.client_port,
            sync_interval=cluster.sync_interval,
            credentials=cluster.credentials,
            binary=cluster.binary,
        )
        self.cluster, self.index, self.name = cluster, index, node.name
        self.runs_authority = index == 0

    @property
    def authority_url(self) -> str:
        return self.cluster.url

    def _config(self, local: str) -> str:
        return node_config(
            self.cluster.layout,
            self.index,
            store_dir=str(self.data_dir / "jetstream"),
            credentials=self.credentials,
            sync_interval=self.sync_interval,
            extra=local,
        )


class EmbeddedCluster:
    """``size`` clustered nats-server processes under ``data_dir``, one directory per node.

    The layout is kept in ``data_dir/cluster.json``: a cluster started again in the same directory
    has the same nodes on the same ports, and its streams come back with it.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        size: int = 3,
        credentials: Credentials | None = None,
        sync_interval: str | None = None,
        base_port: int = 0,
        binary: str | None = None,
    ) -> None:
        self.data_dir = private_dir(Path(data_dir))
        self.credentials = credentials
        self.sync_interval = sync_interval
        self.binary = binary
        path = self.data_dir / "cluster.json"
        if path.exists():
            self.layout = ClusterLayout.load(path)
            if len(self.layout.nodes) != size:
                raise ConfigError(
                    f"the cluster in {self.data_dir} has {len(self.layout.nodes)} nodes, not {size}"
                )
        else:
            self.layout = ClusterLayout.loopback(size, base_port=base_port)
            self.layout.save(path)
        self.nodes = [_Node(self, i) for i in range(size)]

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated."""
        return self.layout.urls

    @property
    def pids(self) -> list[int]:
        """The nodes' processes that run."""
        return [n.pid for n in self.nodes if n.pid is not None]

    def node(self, name: str) -> _Node:
        """The node called ``name`` (as a stream's cluster info names its leader)."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise ConfigError(f"no node {name!r} in the cluster in {self.data_dir}")

    def start(self) -> Self:
        for n in self.nodes:
            n.start()
        return self

    def wipe(self, index: int) -> None:
        """Delete node ``index``'s JetStream data (it must be stopped), as a lost disk would."""
        shutil.rmtree(self.nodes[index].data_dir / "jetstream", ignore_errors=True)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def kill(self) -> None:
        for n in self.nodes:
            n.kill()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def embedded_nats(
    data_dir: str | os.PathLike[str],
    *,
    nodes: int = 1,
    credentials: Credentials | None = None,
    sync_interval: str | None = None,
) -> EmbeddedServer | EmbeddedCluster:
    """One embedded server, or a cluster of ``nodes`` on loopback: what a benchmark or a tool that
    starts its own bus asks for by a node count (both start, stop, and give ``url`` and ``pids``)."""
    if nodes > 1:
        return EmbeddedCluster(data_dir, size=nodes, credentials=credentials, sync_interval=sync_interval)
    return EmbeddedServer(data_dir, credentials=credentials, sync_interval=sync_interval)
