"""The built-in opaque-agent sandbox provider: the agent's working directory, snapshotted as a tree.

``--sandbox DIR-TEMPLATE`` (or ``--sandbox tree:DIR-TEMPLATE``): each attempt's program runs in
the directory the template names (``{rollout_id}`` and ``{attempt}`` filled in; without
``{attempt}`` one directory serves every attempt of a rollout), sandboxed or not. At a checkpoint's
prepare the directory becomes a manifest over content-addressed blobs in the namespace's object
store, as the ``sandbox`` environment's trees do (:mod:`rollcut.sandbox`), and the launcher logs
the manifest's digest (``agent.sandbox``). Before a continued attempt starts, its directory is made
again from the lineage's last snapshot at the cut, every blob checked; a missing or altered one
fails the continuation closed (the rollout starts over, said why).

What it is not: a runtime snapshot. The program starts again from its input with its files as they
were at the cut, and is answered from the journal as under ``replayable_egress``; its memory, its
child processes and its sockets are not restored (docs/sandboxes.md).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

from ..._errors import ConfigError
from ...bus import AgentSandbox, EventLog
from ...sandbox import TREE_PROVIDER, LazyBlobStore, scan
from ..wire import Identity
from ._launcher import SandboxRef

__all__ = ["TreeSnapshot"]


class TreeSnapshot:
    """See the module's docstring."""

    name = TREE_PROVIDER

    def __init__(self, template: str) -> None:
        if "{rollout_id}" not in template:
            raise ConfigError(
                f"--sandbox {template!r}: the directory template names each rollout's with {{rollout_id}}"
            )
        try:
            template.format(rollout_id="r", attempt=1)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"--sandbox {template!r}: only {{rollout_id}} and {{attempt}} are filled in: {exc!r}"
            ) from None
        self.template = template
        self._bucket = LazyBlobStore()

    def bind(self, log: EventLog) -> None:
        self._bucket.bind(log)

    def _path(self, ident: Identity) -> Path:
        """Where the template puts the attempt's directory. The identity's tokens are subject
        tokens (no ``/``, no ``..``), so it stays there."""
        return Path(self.template.format(rollout_id=ident.rollout_id, attempt=ident.attempt))

    def workdir(self, ident: Identity) -> Path:
        """The attempt's working directory, made if missing (0700, as every directory it makes)."""
        path = self._path(ident)
        for made in reversed([p for p in (path, *path.parents) if not p.exists()]):
            made.mkdir(mode=0o700, exist_ok=True)  # what it makes, only its user can enter
        return path

    async def snapshot(self, ident: Identity, checkpoint_id: str) -> SandboxRef:
        tree = await asyncio.to_thread(scan, self.workdir(ident))
        await (await self._bucket.get()).put_snapshot(tree)
        manifest = tree.manifest
        return SandboxRef(manifest.digest(), len(manifest.entries), manifest.size())

    async def restore(self, ident: Identity, record: AgentSandbox) -> None:
        blobs = await self._bucket.get()
        dest = self.workdir(ident)
        staging = Path(tempfile.mkdtemp(prefix=".rollcut-restore-", dir=dest.parent))
        try:
            await blobs.make(record.ref, staging / "tree")
            await asyncio.to_thread(_swap, staging / "tree", dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def close(self, ident: Identity) -> None:
        """The attempt is over: its directory goes (its snapshots stay in the store)."""
        shutil.rmtree(self._path(ident), ignore_errors=True)


def _swap(made: Path, dest: Path) -> None:
    """``dest`` becomes the made tree: what it held goes first (an earlier attempt's files)."""
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(made, dest)
    os.chmod(dest, 0o700)
