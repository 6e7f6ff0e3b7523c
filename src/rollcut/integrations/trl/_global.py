"""One global checkpoint: the trainer's and rollcut's halves bound under one record, published last.

After each optimizer step the trainer saves its checkpoint (model, optimizer, scheduler, RNG,
step); then a :class:`GlobalCheckpoint` names that directory's digest, the rollcut checkpoint
the ledger published last (and the token-store snapshot it binds), the policy version the engine
serves (its GGUF's digest) and the rollout ids the step consumed. The record is written last, in
one rename: until it exists, neither half counts.

Restore (:func:`restorable`) takes the newest record whose halves all verify: the trainer
directory hashes to the digest, the ledger holds the rollcut checkpoint with the same snapshot,
the token store still has that snapshot and it recomputes, and the policy file is the one
recorded. A record with a missing or corrupt half is passed over for the one before it: never a
trainer from one record with rollcut's state from another.

The chain of records is also the hand-off's proof: each rollout id appears in exactly one
record's ``consumed`` (:func:`consumed_history`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import msgspec

from ..._files import file_sha256, private_dir, read_bounded, write_private
from ...ledger import Ledger
from ...tokens import LocalTokenStore

__all__ = [
    "GlobalCheckpoint",
    "RestorePoint",
    "consumed_history",
    "dir_digest",
    "global_records",
    "publish_global",
    "restart_step",
    "restorable",
    "set_aside",
]

_MAX_RECORD = 1 << 20  # a record names ids, digests and a path: a larger file is not one of ours
_ROWS = re.compile(r"step-([0-9]{6,})\.jsonl")  # a step's rows, as the loop names them


class GlobalCheckpoint(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The binding of one optimizer step's trainer checkpoint to rollcut's state (schema 1)."""

    step: int  # the trainer's global step once this checkpoint's optimizer step ran
    trainer_checkpoint: str  # the trainer's directory, relative to the run's root
    trainer_digest: str  # :func:`dir_digest` of that directory
    rollcut_checkpoint_id: str
    token_snapshot_id: str
    token_snapshot_digest: str
    policy_version: int  # the version the engine serves from this point: equal to ``step``
    policy_gguf_sha256: str
    consumed: list[str]  # the rollout ids the optimizer step trained on
    epoch: int = 0  # bumped when a restore passes over newer records (see :func:`restorable`)
    ts: float = 0.0
    schema: int = 1


class RestorePoint(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`restorable` chose, and what it passed over (newest first) and why."""

    record: GlobalCheckpoint | None
    passed_over: list[str]  # "<file>: <reason>"
    epoch: int  # the epoch the resumed run collects in


def dir_digest(path: Path) -> str:
    """SHA-256 over a directory's files: each relative path and the digest of its bytes, in order."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file())
    if not files:
        raise FileNotFoundError(f"{path}: no files")
    for p in files:
        h.update(f"{p.relative_to(path).as_posix()}\0{file_sha256(p)}\n".encode())
    return h.hexdigest()


def _records_dir(root: Path) -> Path:
    return root / "global"


def publish_global(root: Path, record: GlobalCheckpoint) -> Path:
    """Write ``record`` durably and atomically (0600 in a 0700 directory); its path."""
    path = private_dir(_records_dir(root)) / f"step-{record.step:06d}.json"
    write_private(path, msgspec.json.encode(record))
    return path


def global_records(root: Path) -> Iterator[tuple[Path, GlobalCheckpoint | str]]:
    """Every record file, newest step first: the record, or why it cannot be read."""
    where = _records_dir(root)
    for path in sorted(where.glob("step-*.json"), reverse=True) if where.is_dir() else []:
        try:  # a regular file of a record's size, or passed over (a FIFO, /dev/zero, a link)
            yield path, msgspec.json.decode(read_bounded(path, _MAX_RECORD), type=GlobalCheckpoint)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            yield path, f"unreadable: {exc}"


def _problem(root: Path, rec: GlobalCheckpoint, ledger: Ledger, tokens: LocalTokenStore) -> str | None:
    """Why ``rec`` cannot be restored from, or None if every half verifies."""
    trainer = (root / rec.trainer_checkpoint).resolve()
    if not trainer.is_relative_to(root.resolve()):
        return f"its trainer checkpoint {rec.trainer_checkpoint!r} is outside the run"
    try:
        if dir_digest(trainer) != rec.trainer_digest:
            return f"the trainer checkpoint {rec.trainer_checkpoint} does not match its digest"
    except OSError as exc:
        return f"the trainer checkpoint {rec.trainer_checkpoint} cannot be read: {exc}"
    ck = ledger.checkpoint(rec.rollcut_checkpoint_id)
    if ck is None:
        return f"the ledger has no rollcut checkpoint {rec.rollcut_checkpoint_id}"
    if (ck.token_snapshot_id, ck.token_snapshot_digest) != (rec.token_snapshot_id, rec.token_snapshot_digest):
        return f"rollcut checkpoint {rec.rollcut_checkpoint_id} binds another token snapshot"
    snap = tokens.find_snapshot(rec.token_snapshot_id) if rec.token_snapshot_id else None
    if rec.token_snapshot_id and (snap is None or snap.digest != rec.token_snapshot_digest):
        return f"the token store has no snapshot {rec.token_snapshot_id} as recorded"
    if snap is not None and tokens.verify_snapshot(snap):
        return f"the token snapshot {rec.token_snapshot_id} does not recompute"
    gguf = root / "policy" / f"v{rec.policy_version}.gguf"
    try:
        if file_sha256(gguf) != rec.policy_gguf_sha256:
            return f"the policy file of version {rec.policy_version} is not the recorded one"
    except OSError as exc:
        return f"the policy file of version {rec.policy_version} cannot be read: {exc}"
    return None


def restorable(root: Path, ledger: Ledger, tokens: LocalTokenStore) -> RestorePoint:
    """The newest record whose halves all verify (None if there is none: start from step 0).

    Passing over a newer record means the run goes back past work done after the chosen one
    (rows collected by policy versions this restore will not reproduce): the resumed run then
    collects in a new epoch, whose rollout ids are new, so none of that work is mistaken for
    its own."""
    passed: list[str] = []
    epochs = [0]
    for path, rec in global_records(root):
        if isinstance(rec, str):
            passed.append(f"{path.name}: {rec}")
            continue
        epochs.append(rec.epoch)
        why = _problem(root, rec, ledger, tokens)
        if why is None:
            epoch = max(epochs) + 1 if passed else rec.epoch
            return RestorePoint(record=rec, passed_over=passed, epoch=epoch)
        passed.append(f"{path.name}: {why}")
    return RestorePoint(record=None, passed_over=passed, epoch=max(epochs) + 1 if passed else 0)


def set_aside(root: Path, point: RestorePoint) -> None:
    """After a restore that passed over newer records (or one told to start the interrupted step
    over, :func:`restart_step`): those records, and the rows of every step from the chosen one on,
    move under ``passed-over-e<epoch>/`` (kept for a post-mortem, no longer history), so the new
    epoch starts those steps from nothing."""
    if point.epoch == 0 or (point.record is not None and point.epoch == point.record.epoch):
        return
    first = 0 if point.record is None else point.record.step
    aside = root / f"passed-over-e{point.epoch}"
    aside.mkdir(mode=0o700, exist_ok=True)
    for line in point.passed_over:
        name = line.split(":", 1)[0]
        with contextlib.suppress(FileNotFoundError):
            os.replace(_records_dir(root) / name, aside / name)
    for rows in sorted((root / "rows").glob("step-*.jsonl")):
        step = _ROWS.fullmatch(rows.name)
        if step is not None and int(step[1]) >= first:  # what is not the loop's own is left alone
            os.replace(rows, aside / rows.name)


def restart_step(point: RestorePoint) -> RestorePoint:
    """``point``, made to collect the step it resumes from nothing, in a new epoch: what a crash
    costs a loop that keeps no rollout across it (``rollcut bench train --crash`` measures both)."""
    epoch = max(point.epoch, 0 if point.record is None else point.record.epoch) + 1
    return RestorePoint(record=point.record, passed_over=point.passed_over, epoch=epoch)


def consumed_history(root: Path) -> list[tuple[int, list[str]]]:
    """The committed hand-off: (optimizer step, rollout ids it trained on) from each readable
    record, oldest first (records a restore passed over were set aside: not history)."""
    out: dict[int, list[str]] = {}
    for _, rec in global_records(root):
        if isinstance(rec, GlobalCheckpoint) and rec.step not in out:
            out[rec.step] = rec.consumed
    return sorted(out.items())
