"""What an opaque agent's sandbox binds: the program and the installation it declares itself part
of, never the directories around it, and of the host's ``/etc`` only what programs read to run
(issue 49: ``--command <dir>/bin/agent`` bound all of ``<dir>``, a rollcut home's operator seed
beside it included, and as root the sandbox read ``/etc/shadow``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from rollcut.gym.opaque import READ_ONLY_ROOT, Isolation
from rollcut.sandbox._isolation import _command_paths

SECRET = "SUOPERATORSEED-not-for-agents"


def _run_sandboxed(agent: Path) -> subprocess.CompletedProcess[str]:
    argv = [*Isolation.find().confined(_command_paths([str(agent)])), *READ_ONLY_ROOT, "--", str(agent)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_a_program_in_a_plain_bin_directory_cannot_read_the_home_beside_it(tmp_path: Path) -> None:
    home = tmp_path / "project" / ".rollcut" / "nats"
    home.mkdir(parents=True)
    (home / "credentials.json").write_text(f'{{"operator_seed": "{SECRET}"}}')
    agent = tmp_path / "project" / "bin" / "agent"
    agent.parent.mkdir()
    creds = home / "credentials.json"
    agent.write_text(
        f"#!/bin/sh\ncat {creds} 2>&1; cat /etc/shadow 2>&1; ls {tmp_path / 'project'} 2>&1; echo ran\n"
    )
    agent.chmod(0o755)
    done = _run_sandboxed(agent)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("ran"), done
    assert SECRET not in done.stdout and "root:" not in done.stdout, done.stdout
    assert done.stdout.splitlines()[-2:] == ["bin", "ran"], done.stdout  # the project shows only bin/


def test_a_virtual_environments_program_still_gets_its_environment(tmp_path: Path) -> None:
    """A program installed in a venv (``pyvenv.cfg``) runs with its packages: the installation it
    declares is bound, and nothing above it."""
    venv = tmp_path / "project" / "venv"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    pkg = venv / "lib" / "mine.py"
    pkg.write_text("WHO = 'from the venv'\n")
    agent = venv / "bin" / "agent"
    agent.write_text(
        f"#!{venv / 'bin' / 'python'}\nimport sys; sys.path.insert(0, '{venv / 'lib'}')\n"
        "import mine; print(mine.WHO)\n"
    )
    agent.chmod(0o755)
    (tmp_path / "project" / "secret.txt").write_text(SECRET)
    done = _run_sandboxed(agent)
    assert done.returncode == 0 and done.stdout.strip() == "from the venv", done
    assert str(tmp_path / "project") not in _command_paths([str(agent)])
