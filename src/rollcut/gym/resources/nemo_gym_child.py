"""Run one NeMo Gym resources server, unmodified, from its own config: ``python nemo_gym_child.py NAME PORT``.

Run by NeMo Gym's Python (the cached environment), never imported by rollcut. A NeMo Gym server
process reads its whole config from ``NEMO_GYM_CONFIG_DICT`` and its own block's name from
``NEMO_GYM_CONFIG_PATH`` (as NeMo Gym's launcher starts it; no head server is needed): the block is
the server's own ``configs/NAME.yaml`` entry for ``resources_servers: {NAME: ...}``, with the host
and port set here. Configuration and launching only; the server's code runs as it ships.
"""

import json
import os
import runpy
import sys
from pathlib import Path


def main() -> None:
    name, port = sys.argv[1], int(sys.argv[2])
    import resources_servers
    from omegaconf import OmegaConf

    folder = Path(next(iter(resources_servers.__path__))) / name
    block, instance = None, name
    for path in sorted((folder / "configs").glob("*.yaml")):
        doc = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        for key, value in (doc or {}).items():
            servers = value.get("resources_servers") if isinstance(value, dict) else None
            if isinstance(servers, dict) and name in servers:
                block, instance = dict(servers[name]), key
                break
        if block is not None:
            break
    if block is None:
        sys.exit(f"{name}: no configs/*.yaml declares resources_servers.{name}")
    block.update(host="127.0.0.1", port=port)
    head = {"host": "127.0.0.1", "port": 1}  # never called: the server reads its config from here
    config = {"dry_run": False, "head_server": head, instance: {"resources_servers": {name: block}}}
    os.environ["NEMO_GYM_CONFIG_DICT"] = json.dumps(config)
    os.environ["NEMO_GYM_CONFIG_PATH"] = instance
    runpy.run_module(f"resources_servers.{name}.app", run_name="__main__")


if __name__ == "__main__":
    main()
