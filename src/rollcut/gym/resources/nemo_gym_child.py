"""Run one NeMo Gym server, unmodified, from its own config: ``python nemo_gym_child.py KIND NAME PORT``.

Run by NeMo Gym's Python (the cached environment); rollcut imports only :func:`server_block`
(stdlib), the one search for a server's own config block. A NeMo Gym server
process reads its whole config from ``NEMO_GYM_CONFIG_DICT`` and its own block's name from
``NEMO_GYM_CONFIG_PATH`` (as NeMo Gym's launcher starts it; no head server is needed). KIND is
``resources_servers`` or ``responses_api_agents``; the block is the server's own
``configs/*.yaml`` entry for ``KIND: {NAME: ...}``, with the host and port set here. An agent's
resources and model servers are rollcut's, named in ``ROLLCUT_NEMO_GYM_PEERS`` (JSON:
``{"resources": {"name": ..., "url": ...}, "model": url}``), and observability is on, so every call
the agent makes carries its rollout's ``/ng-rollout/<id>[-a<n>]`` prefix. Configuration and
launching only; the server's code runs as it ships.
"""

import importlib
import json
import os
import runpy
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

RESOURCES, MODEL = "rollcut_resources", "policy_model"  # the names the agent's block is given


def server_block(docs: Iterable[Any], kind: str, name: str) -> tuple[dict[str, Any], str] | None:
    """A server's own block among its parsed ``configs/*.yaml`` documents (``{instance: {kind:
    {name: block}}}``), and the instance it is declared under; None if none declares it. Stdlib
    only: rollcut's catalogue reads the same files with its own YAML parser and this search."""
    for doc in docs:
        for key, value in doc.items() if isinstance(doc, dict) else ():
            servers = value.get(kind) if isinstance(value, dict) else None
            if isinstance(servers, dict) and isinstance(servers.get(name), dict):
                return dict(servers[name]), str(key)
    return None


def _block(kind: str, name: str) -> tuple[dict[str, Any], str]:
    from omegaconf import OmegaConf

    package = importlib.import_module(kind)
    folder = Path(next(iter(package.__path__))) / name
    docs = (
        OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        for path in sorted((folder / "configs").glob("*.yaml"))
    )
    found = server_block(docs, kind, name)
    if found is None:
        sys.exit(f"{name}: no configs/*.yaml declares {kind}.{name}")
    return found


def _at(url: str) -> dict[str, Any]:
    where = urlsplit(url)
    return {"host": where.hostname, "port": where.port, "entrypoint": "app.py"}


def main() -> None:
    kind, name, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    block, instance = _block(kind, name)
    block.update(host="127.0.0.1", port=port)
    head = {"host": "127.0.0.1", "port": 1}  # never called: the server reads its config from here
    config = {"dry_run": False, "head_server": head, instance: {kind: {name: block}}}
    peers = json.loads(os.environ.get("ROLLCUT_NEMO_GYM_PEERS") or "{}")
    if kind == "responses_api_agents":
        res = peers["resources"]
        block["resources_server"] = {"type": "resources_servers", "name": RESOURCES}
        block["model_server"] = {"type": "responses_api_models", "name": MODEL}
        config[RESOURCES] = {"resources_servers": {res["name"]: {**_at(res["url"]), "domain": "agent"}}}
        config[MODEL] = {"responses_api_models": {"rollcut": _at(peers["model"])}}
        config["observability_enabled"] = True  # every call names its rollout's attempt
    os.environ["NEMO_GYM_CONFIG_DICT"] = json.dumps(config)
    os.environ["NEMO_GYM_CONFIG_PATH"] = instance
    runpy.run_module(f"{kind}.{name}.app", run_name="__main__")


if __name__ == "__main__":
    main()
