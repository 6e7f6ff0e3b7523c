"""Hosts of the project's own for the tests (``rollcut.testing.Hosts``): iproute2 installed where it
is absent, and the session stopped, saying why, where hosts cannot be made."""

from __future__ import annotations

import shutil

import pytest

from rollcut.testing import Hosts, hosts_possible, netns_cluster

from .apt import install

__all__ = ["Hosts", "hosts_available", "netns_cluster"]


def hosts_available() -> None:
    if shutil.which("ip") is None:
        why = install("iproute2")
        if why:
            pytest.exit(why, returncode=3)
    why = hosts_possible()
    if why:
        pytest.exit(f"{why} (the tests run as root here and in CI)", returncode=3)
