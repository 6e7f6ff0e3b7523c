"""The process harness: every Gym server as a real process, as the demo, the e2e suite and the
benchmarks run them (as ``temporalio.testing`` gives users the environment the SDK's own tests use).

:class:`ServerProcess` starts one server from its options and reads its readiness lines;
``kill()`` is a SIGKILL of every process of it. :func:`start_stack` starts a whole stack (model,
resources, agent, environment) on a bus.
"""

from ._harness import DEMO_ENVIRONMENTS, ServerProcess, start_stack

__all__ = ["DEMO_ENVIRONMENTS", "ServerProcess", "start_stack"]
