"""NeMo Gym installed once, as the engines are: a cached environment with the pinned wheel.

``nemo-gym`` 0.7.0 asks for Python >= 3.13.14. The newest Python this machine has that can run it
is preferred: one meeting 3.13.14 when there is one, else the newest 3.13 (here the image's pyenv
3.13.0), installed with ``--ignore-requires-python``. What that risks: the package's authors test
on 3.13.14 and later, and a fix they rely on between 3.13.0 and 3.13.14 could be missing (none of
3.13's patch releases changed the language or removed an API, they fix bugs); the check that
shows it runs is run at install (its servers import) and by the suite (a real server seeded,
called and verified). The wheel is fetched alone and its sha256 compared with the pinned digest
before pip installs it and its dependencies from the package index.

Cached under ``<cache>/nemo-gym/nemo-gym-<version>`` with a ``.complete`` record saying which
Python and why; a lock makes concurrent callers build it once. ``ROLLCUT_NEMO_GYM_PYTHON`` names the
interpreter to build with.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec

from ..._cache import cache_root, locked
from ..._errors import RollcutError

__all__ = [
    "NEMO_GYM",
    "NemoGymInstalled",
    "NemoGymUnavailableError",
    "env_python",
    "install",
    "installed",
    "site_packages",
]

NEMO_GYM = ("nemo-gym", "0.7.0", "cce78fc3fd048f36b4c465fe8e9fe3cc5e7afb6f6e287bfe831f156988508a70")
"""The package, its version, and its wheel's sha256 (``nemo_gym-0.7.0-py3-none-any.whl``)."""
REQUIRES = (3, 13, 14)
"""The Python the wheel asks for (its ``Requires-Python``)."""


class NemoGymUnavailableError(RollcutError):
    """NeMo Gym is not installed here and cannot be (no Python 3.13, no index, a changed wheel)."""


class NemoGymInstalled(msgspec.Struct, frozen=True, kw_only=True):
    """What ``rollcut nemo-gym install`` made: where, with which Python, and why that one."""

    version: str
    python: str
    python_version: str
    ignore_requires_python: bool
    wheel_sha256: str
    why: str


def _env_dir() -> Path:
    name, version, _ = NEMO_GYM
    return cache_root() / "nemo-gym" / f"{name}-{version}"


def _version_of(python: str) -> tuple[int, ...] | None:
    env = {**os.environ, "PYENV_VERSION": os.environ.get("PYENV_VERSION", "")}
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:3])"],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return tuple(int(x) for x in out.stdout.split()) if out.returncode == 0 else None


def _candidates() -> list[str]:
    """Pythons 3.13 this machine has: the one named, pyenv's 3.13 versions, 3.13 on the PATH."""
    named = os.environ.get("ROLLCUT_NEMO_GYM_PYTHON")
    if named:
        return [named]
    found: list[str] = []
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if root.is_dir():
        versions = [p for p in sorted(root.iterdir()) if re.match(r"3\.13\.\d+$", p.name)]
        found += [str(p / "bin" / "python3.13") for p in versions]
    for name in ("python3.13", "python3"):
        path = shutil.which(name)
        if path and "/shims/" not in path:  # a pyenv shim refuses without a version: the versions are above
            found.append(path)
    return found


def _pick() -> tuple[str, tuple[int, ...]]:
    seen = [(p, v) for p in _candidates() if Path(p).exists() and (v := _version_of(p)) and v[:2] == (3, 13)]
    if not seen:
        raise NemoGymUnavailableError(
            "NeMo Gym needs Python 3.13 and none was found (set ROLLCUT_NEMO_GYM_PYTHON to one)"
        )
    return max(seen, key=lambda pv: pv[1])


def _run(argv: list[str], what: str) -> str:
    try:
        done = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=3600)
    except subprocess.CalledProcessError as exc:
        raise NemoGymUnavailableError(f"{what} failed ({exc.returncode}): {exc.stderr[-1500:]}") from exc
    return done.stdout


def installed() -> NemoGymInstalled | None:
    """The cached environment's record, or None when there is none (yet)."""
    done = _env_dir() / ".complete"
    return msgspec.json.decode(done.read_bytes(), type=NemoGymInstalled) if done.is_file() else None


def install() -> NemoGymInstalled:
    """The cached NeMo Gym environment, made first if absent (about 75 s with a warm pip cache)."""
    with locked(_env_dir().parent / ".nemo-gym.lock"):
        have = installed()
        if have is None:
            have = _build(_env_dir())
            (_env_dir() / ".complete").write_bytes(msgspec.json.encode(have))
    return have


def _build(where: Path) -> NemoGymInstalled:
    name, version, digest = NEMO_GYM
    python, pyver = _pick()
    ignore = pyver < REQUIRES
    if where.exists():
        shutil.rmtree(where)  # a build killed midway: start over
    _run([python, "-m", "venv", str(where)], "creating NeMo Gym's environment")
    py = str(where / "bin" / "python")
    relax = ["--ignore-requires-python"] if ignore else []
    wheels = where / "wheel"
    _run([py, "-m", "pip", "download", "-q", "--no-deps", *relax, f"{name}=={version}", "-d", str(wheels)],
         f"downloading {name}=={version}")  # fmt: skip
    wheel = next(wheels.glob("nemo_gym-*.whl"), None)
    if wheel is None:
        raise NemoGymUnavailableError(f"the index gave no wheel of {name}=={version}")
    got = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if got != digest:
        raise NemoGymUnavailableError(f"{wheel.name} has sha256 {got}, not the pinned {digest}")
    _run([py, "-m", "pip", "install", "-q", *relax, str(wheel)], f"installing {wheel.name}")
    _run([py, "-c", "import nemo_gym.base_resources_server, resources_servers"], "importing NeMo Gym")
    shown = ".".join(map(str, pyver))
    why = (
        f"Python {shown} meets nemo-gym's >= 3.13.14"
        if not ignore
        else f"Python {shown} is the newest 3.13 here; nemo-gym asks for >= 3.13.14, so it was installed "
        "with --ignore-requires-python (docs/nemo-gym.md says what that risks)"
    )
    return NemoGymInstalled(
        version=version, python=python, python_version=shown, ignore_requires_python=ignore,
        wheel_sha256=got, why=why,
    )  # fmt: skip


def _absent() -> NemoGymUnavailableError:
    how = f"run `rollcut nemo-gym install`; cache {_env_dir()}"
    return NemoGymUnavailableError(f"NeMo Gym is not installed ({how})")


def env_python() -> Path:
    """The cached environment's Python; refused, saying how to make it, when there is none."""
    if installed() is None:
        raise _absent()
    return _env_dir() / "bin" / "python"


def site_packages() -> Path:
    """Where the installed wheel's packages are (``resources_servers``, ``responses_api_agents``)."""
    found = sorted((_env_dir() / "lib").glob("python3.*/site-packages"))
    if installed() is None or not found:
        raise _absent()
    return found[0]


if __name__ == "__main__":  # pragma: no cover
    print(msgspec.json.encode(install()).decode(), file=sys.stdout)
