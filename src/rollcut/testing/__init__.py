"""The process harness: every Gym server as a real process, as the demo, the e2e suite and the
benchmarks run them (as ``temporalio.testing`` gives users the environment the SDK's own tests use).

:class:`ServerProcess` starts one server from its options and reads its readiness lines;
``kill()`` is a SIGKILL of every process of it. :func:`start_stack` starts a whole stack (model,
resources, agent, environment) on a bus. :class:`Hosts` makes hosts of one's own on this machine
(network namespaces on a bridge) to split a cluster's network; :func:`missing_acks` checks, after a
fault, that every acknowledgement a writer was told is in the stream.
"""

from ._acks import acked, generated_twice, missing_acks
from ._harness import DEMO_ENVIRONMENTS, ServerProcess, start_stack
from ._hosts import Hosts, hosts_possible, netns_cluster, stream_leader

__all__ = [
    "DEMO_ENVIRONMENTS",
    "Hosts",
    "ServerProcess",
    "acked",
    "generated_twice",
    "hosts_possible",
    "missing_acks",
    "netns_cluster",
    "start_stack",
    "stream_leader",
]
