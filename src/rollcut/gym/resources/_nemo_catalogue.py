"""Every NeMo Gym server and agent of the installed wheel, with the level rollcut gives it and why.

A level is declared, or read from a fact of the server as it ships, never guessed from its name:

- ``replayable``, ``stateless``, ``restart_only`` with a reason: the servers rollcut has checked
  (:data:`~rollcut.gym.resources._nemo_gym.DECLARED`); ``replayed``: the agents it has driven
  through a crash.
- ``cannot_run_here``: the server's own ``configs/*.yaml`` block or ``requirements.txt`` says it
  needs what rollcut's NeMo Gym environment does not give it: a second model (a key ending in
  ``_model_server`` in a resources server's block: a judge, a simulated user), a GPU (a key naming
  one, set, and not one that disables it), an outside
  service's credential (a key naming an ``api_key``), a container runtime (docker, apptainer or
  singularity named in its block), or packages its ``requirements.txt`` lists that the
  environment does not have (``rollcut nemo-gym install`` installs the wheel alone; NeMo Gym's own
  launcher makes a virtual environment per server). Each reason names the key or the packages.
- ``restart_only`` (a resources server) or ``not_checked`` (an agent): everything else.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import yaml

from ._nemo_gym import DECLARED, DEFAULT
from ._nemo_install import site_packages
from .nemo_gym_child import server_block

__all__ = ["AGENTS_CHECKED", "Level", "catalogue"]

AGENTS_CHECKED: dict[str, tuple[str, str]] = {
    "simple_agent": (
        "replayed",
        "a continued attempt runs /run again: its model calls answered from the log, its tool calls "
        "from the journal (checked: tests/e2e/test_nemo_gym.py, through a SIGKILL)",
    ),
    "gymnasium_agent": (
        "replayed",
        "as simple_agent, over /reset and /step (checked with blackjack: tests/e2e/test_nemo_gym.py)",
    ),
}
"""NeMo Gym's agents rollcut has driven through a crash (``rollcut serve agent nemo-gym NAME``)."""
_AGENT_DEFAULT = (
    "not_checked",
    "runs under `rollcut serve agent nemo-gym NAME` as any agent does, not yet checked through a crash",
)
CANNOT_RUN_HERE = "cannot_run_here"
_CONTAINERS = re.compile(r"\b(docker|apptainer|singularity)\b", re.IGNORECASE)
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_KINDS = {  # kind -> its package in the wheel, the ones rollcut checked, and the level of the rest
    "resources_server": ("resources_servers", DECLARED, DEFAULT),
    "agent": ("responses_api_agents", AGENTS_CHECKED, _AGENT_DEFAULT),
}


class Level(msgspec.Struct, frozen=True, kw_only=True):
    """One NeMo Gym server or agent of the installed version, and what rollcut gives it."""

    kind: str  # resources_server | agent
    name: str
    level: str
    why: str


def catalogue() -> list[Level]:
    """Every resources server and agent of the installed wheel, with its level under rollcut."""
    root = site_packages()
    installed = {_canonical(p.name.split("-", 1)[0]) for p in root.glob("*.dist-info")}
    out = []
    for kind, (package, checked, default) in _KINDS.items():
        for app in sorted((root / package).glob("*/app.py")):
            name = app.parent.name
            needs = [] if name in checked else _needs(app.parent, package, installed)
            level, why = (
                (CANNOT_RUN_HERE, "needs " + "; ".join(needs)) if needs else checked.get(name, default)
            )
            out.append(Level(kind=kind, name=name, level=level, why=why))
    return out


def _needs(folder: Path, package: str, installed: set[str]) -> list[str]:
    """What the server's own files say it needs that is not here, each naming its evidence."""
    block = _block(folder, package)
    items = list(_items(block))
    keys = sorted({k for k, _ in items})
    needs = []
    if package == "resources_servers":  # an agent's model_server is the policy: rollcut's
        models = [k for k in keys if k.endswith("_model_server")]
        if models:
            needs.append(f"a second model server (its config's {', '.join(models)})")
    gpus = sorted({k for k, v in items if "gpu" in k.lower() and "disable" not in k.lower() and v})
    if gpus:
        needs.append(f"a GPU (its config's {', '.join(gpus)})")
    credentials = [k for k in keys if "api_key" in k.lower()]
    if credentials:
        needs.append(f"an outside service's credential (its config's {', '.join(credentials)})")
    containers = sorted({m.lower() for m in _CONTAINERS.findall(yaml.safe_dump(block))})
    if containers:
        needs.append(f"a container runtime (its config names {', '.join(containers)})")
    missing = [r for r in _requirements(folder) if _canonical(r) not in installed]
    if missing:
        needs.append(f"packages rollcut's NeMo Gym environment lacks ({', '.join(missing)})")
    return needs


def _block(folder: Path, package: str) -> dict[str, Any]:
    """The server's own block in its ``configs/*.yaml`` (empty where none parses or declares it)."""
    docs = (_yaml(p) for p in sorted((folder / "configs").glob("*.yaml")))
    found = server_block(docs, package, folder.name)
    return found[0] if found else {}


def _yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return None


def _items(node: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) of a config block, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield str(key), value
            yield from _items(value)
    elif isinstance(node, list):
        for item in node:
            yield from _items(item)


def _requirements(folder: Path) -> list[str]:
    path = folder / "requirements.txt"
    lines = path.read_text().splitlines() if path.is_file() else []
    wanted = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith(("#", "-"))]
    names = [
        _url_name(line) if "://" in line else m.group(1) for line in wanted if (m := _REQUIREMENT.match(line))
    ]
    return sorted({n for n in names if _canonical(n) != "nemo-gym"}, key=str.lower)


def _url_name(line: str) -> str:
    """The package a URL requirement names (never installed here): a wheel's name, a repository's."""
    where = urlsplit(line.split("@", 1)[-1].strip() if " @ " in line else line.removeprefix("git+"))
    parts = [p.split("@", 1)[0] for p in where.path.split("/") if p]  # a git ref after @ is no name
    last = parts[-1] if parts else where.netloc
    if last.endswith(".whl"):
        return last.split("-", 1)[0]
    if where.netloc == "github.com" and len(parts) >= 2:
        return parts[1].removesuffix(".git")
    return last.removesuffix(".git")


def _canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()
