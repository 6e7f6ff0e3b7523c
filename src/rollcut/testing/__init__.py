"""The process harness: every Gym server as a real process, as the demo, the e2e suite and the
benchmarks run them (as ``temporalio.testing`` gives users the environment the SDK's own tests use).

:class:`ServerProcess` starts one server from its options and reads its readiness lines;
``kill()`` is a SIGKILL of every process of it. :func:`start_stack` starts a whole stack (model,
resources, agent, environment) on a bus. :class:`Hosts` makes hosts of one's own on this machine
(network namespaces on a bridge) to split a cluster's network; :func:`missing_acks` checks, after a
fault, that every acknowledgement a writer was told is in the stream, and :func:`each_rollout_once`
that every rollout has exactly one row (the oracle rollcut's own e2e suite holds every collection to).

The extension kit: :class:`TokenStoreContract`, :class:`EnvironmentContract` and
:class:`BackendContract` are the suites every token store, every continuing environment and every
cutting backend pass, rollcut's and another package's (they need pytest, and are loaded only when
asked for).
"""

import typing as _typing

from .._lazy import lazy_names as _lazy_names
from ._acks import acked, each_rollout_once, generated_twice, missing_acks
from ._harness import DEMO_ENVIRONMENTS, ServerProcess, start_stack, stop_stack
from ._hosts import Hosts, hosts_possible, netns_cluster, stream_leader
from ._linkshape import LinkShape

if _typing.TYPE_CHECKING:
    from ._backend_contract import BackendContract
    from ._contracts import TokenStoreContract, sample_record
    from ._env_contract import EnvironmentContract

__getattr__ = _lazy_names(
    __name__,
    {
        "_contracts": ("TokenStoreContract", "sample_record"),
        "_env_contract": ("EnvironmentContract",),
        "_backend_contract": ("BackendContract",),
    },
    globals(),
)

__all__ = [
    "DEMO_ENVIRONMENTS",
    "BackendContract",
    "EnvironmentContract",
    "Hosts",
    "LinkShape",
    "ServerProcess",
    "TokenStoreContract",
    "acked",
    "each_rollout_once",
    "generated_twice",
    "hosts_possible",
    "missing_acks",
    "netns_cluster",
    "sample_record",
    "start_stack",
    "stop_stack",
    "stream_leader",
]
