"""File-based checkpoint designs rollcut is measured against, on the same state.

Both stop the world for their whole duration (nothing may change while the
files are written), and both write concurrently, one thread per participant,
as separate processes would.

- ``nemo``: NeMo Gym's store as it is built: one records JSONL per
  participant, hashed while written, fsynced, renamed to its digest; then a
  manifest of the digests, fsynced and published by hard link.
- ``per_file``: a file per rollout per participant (write, fsync, rename),
  then a manifest per participant and an aggregate one (the original
  proposal's design).
"""

from __future__ import annotations

import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec

__all__ = ["BASELINES", "baseline_checkpoint"]

BASELINES = ("nemo", "per_file")
"""The file-based checkpoint designs ``bench checkpoint`` measures against, by name."""


def _fsync_dir(d: Path) -> None:
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _write_durable(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)


def _per_file_participant(d: Path, states: dict[str, bytes]) -> int:
    digests = {}
    for rid, blob in states.items():
        _write_durable(d / f"{rid}.json", blob)
        digests[rid] = hashlib.blake2b(blob, digest_size=16).hexdigest()
    _write_durable(d / "manifest.json", msgspec.json.encode(digests))
    _fsync_dir(d)
    return len(states) + 1


def _nemo_participant(d: Path, states: dict[str, bytes]) -> int:
    tmp = d / "records.jsonl.tmp"
    h = hashlib.sha256()
    with open(tmp, "wb") as f:
        for rid, blob in states.items():
            line = b'{"rollout_id":"' + rid.encode() + b'","state":' + blob + b"}\n"
            h.update(line)
            f.write(line)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(d / f"records-{h.hexdigest()[:16]}.jsonl")
    _fsync_dir(d)
    return 1


def _nemo_manifest(root: Path) -> None:
    records = sorted(f"{d.name}/{p.name}" for d in root.iterdir() if d.is_dir() for p in d.iterdir())
    tmp = root / "manifest.json.tmp"
    with open(tmp, "wb") as f:
        f.write(msgspec.json.encode({"records": records}))
        f.flush()
        os.fsync(f.fileno())
    os.link(tmp, root / "manifest.json")  # the publication
    tmp.unlink()
    _fsync_dir(root)


def baseline_checkpoint(kind: str, root: Path, states: dict[str, dict[str, bytes]]) -> tuple[float, int]:
    """One checkpoint of ``states`` (participant -> rollout -> JSON state) the ``kind`` way, into the
    fresh directory ``root``: its time in ms and how many files it wrote."""
    one = _nemo_participant if kind == "nemo" else _per_file_participant
    dirs = {name: root / name for name in states}
    for d in dirs.values():
        d.mkdir(parents=True)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(states)) as pool:
        counts = list(pool.map(lambda name: one(dirs[name], states[name]), states))
    if kind == "nemo":
        _nemo_manifest(root)
    else:
        _write_durable(root / "manifest.json", msgspec.json.encode({"participants": list(states)}))
        _fsync_dir(root)
    return (time.perf_counter() - t0) * 1000, sum(counts) + 1
