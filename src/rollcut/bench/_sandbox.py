"""``rollcut bench sandbox``: what a sandbox's checkpoint costs, against archiving the whole tree.

``sessions`` sessions seeded from one task tree of ``files`` text files of about ``size`` bytes
each (seeded words, as source code compresses), checkpointed twice: once as seeded, then after
``changed`` percent of each session's files were rewritten. Two ways, in the same run, on the
same trees:

- **rollcut**: scan, put the blobs the namespace's bucket lacks (JetStream's object store on an
  embedded nats-server), put the manifest. Sessions share the task's blobs; a second checkpoint
  stores what changed.
- **tar + zstd**: one archive of the whole tree per session and checkpoint (zstd level 3), what
  an archive-per-checkpoint or rebuild-per-reset design pays, written to a local file.

Reported per way: seconds and bytes stored for all sessions' first and second checkpoints, and
the seconds to restore one session's tree (materialise every blob checked, or extract the
archive); ``vs_tar`` ratios of rollcut's figure over the archive's, with their spread over the
repeats. Bytes are what each way hands its storage: rollcut's blobs go to the object store as
they are (its stream compresses them on disk with S2, which this figure does not see), the
archive is zstd's output; so a first checkpoint of one session is smaller as an archive, and the
design pays off with sessions that share a tree and with checkpoints that change little.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import zstandard

from ..bus import BusConfig, EmbeddedServer, EventLog
from ..sandbox import BlobStore, scan
from ._spread import spread

__all__ = ["bench_sandbox"]

_WORDS = ["def", "return", "self", "import", "for", "in", "if", "else", "while", "class", "yield", "value"]


def _text(rng: random.Random, size: int) -> str:
    out: list[str] = []
    n = 0
    while n < size:  # keywords and made-up names and numbers: compresses about as source code does
        words = [rng.choice(_WORDS) if rng.random() < 0.6 else f"x{rng.randrange(10**6):x}" for _ in range(6)]
        line = " ".join(words) + f" = {rng.randrange(10**4)}\n"
        out.append(line)
        n += len(line)
    return "".join(out)[:size]


def _seed_tree(root: Path, files: int, size: int, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(files):
        path = root / f"pkg{i % 10}" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_text(rng, size))


def _change(root: Path, files: int, size: int, percent: float, seed: int) -> None:
    rng = random.Random(seed)
    count = max(1, round(files * percent / 100))
    for i in rng.sample(range(files), count):
        (root / f"pkg{i % 10}" / f"mod{i}.py").write_text(_text(rng, size))


def _archive(root: Path, out: Path) -> int:
    with (
        out.open("wb") as f,
        zstandard.ZstdCompressor(level=3).stream_writer(f) as z,
        tarfile.open(fileobj=z, mode="w|") as tar,
    ):
        tar.add(root, arcname=".")
    return out.stat().st_size


def _extract(archive: Path, dest: Path) -> None:
    dest.mkdir()
    with (
        archive.open("rb") as f,
        zstandard.ZstdDecompressor().stream_reader(f) as z,
        tarfile.open(fileobj=z, mode="r|") as tar,
    ):
        tar.extractall(dest, filter="data")


async def _rollcut_checkpoint(store: BlobStore, trees: list[Path]) -> tuple[float, int]:
    t0 = time.perf_counter()
    stored = 0
    for root in trees:
        tree = await asyncio.to_thread(scan, root)
        stored += (await store.put_snapshot(tree)).bytes_put
    return time.perf_counter() - t0, stored


def _tar_checkpoint(trees: list[Path], where: Path, tag: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    stored = sum(_archive(root, where / f"{tag}-{i}.tar.zst") for i, root in enumerate(trees))
    return time.perf_counter() - t0, stored


async def _once(
    tmp: Path, url: str, n: int, *, files: int, size: int, changed: float, sessions: int
) -> dict[str, float]:
    log = await EventLog.connect(BusConfig(url=url, namespace=f"sb{n}"))
    try:
        store = await BlobStore.open(log.nc.jetstream(), f"sb{n}")
        task = tmp / f"task{n}"
        _seed_tree(task, files, size, seed=n)
        trees = []
        for i in range(sessions):
            trees.append(tmp / f"s{n}-{i}")
            shutil.copytree(task, trees[-1])
        archives = tmp / f"archives{n}"
        archives.mkdir()
        r1 = await _rollcut_checkpoint(store, trees)
        t1 = _tar_checkpoint(trees, archives, "first")
        for i, root in enumerate(trees):
            _change(root, files, size, changed, seed=1000 * n + i)
        r2 = await _rollcut_checkpoint(store, trees)
        t2 = _tar_checkpoint(trees, archives, "second")
        manifest = scan(trees[0]).manifest
        t0 = time.perf_counter()
        await store.materialise(manifest, tmp / f"restored{n}")
        r_restore = time.perf_counter() - t0
        t0 = time.perf_counter()
        _extract(archives / "second-0.tar.zst", tmp / f"extracted{n}")
        t_restore = time.perf_counter() - t0
    finally:
        await log.close()
    return {
        "rollcut_first_s": r1[0],
        "rollcut_first_bytes": r1[1],
        "tar_first_s": t1[0],
        "tar_first_bytes": t1[1],
        "rollcut_second_s": r2[0],
        "rollcut_second_bytes": r2[1],
        "tar_second_s": t2[0],
        "tar_second_bytes": t2[1],
        "rollcut_restore_s": r_restore,
        "tar_restore_s": t_restore,
    }


async def bench_sandbox(
    *,
    files: int = 500,
    size: int = 2048,
    changed: tuple[float, ...] = (1.0, 100.0),
    sessions: int = 8,
    repeat: int = 3,
) -> dict[str, Any]:
    """See the module's docstring."""
    out: dict[str, Any] = {
        "files": files,
        "size": size,
        "sessions": sessions,
        "repeat": repeat,
        "by_changed": {},
    }
    with (
        tempfile.TemporaryDirectory(prefix="rollcut-bench-sandbox-") as tmp,
        EmbeddedServer(Path(tmp) / "nats") as nats,
    ):
        n = 0
        for percent in changed:
            runs = []
            for _ in range(repeat):
                runs.append(
                    await _once(
                        Path(tmp), nats.url, n, files=files, size=size, changed=percent, sessions=sessions
                    )
                )
                n += 1
            keys = runs[0].keys()
            figures: dict[str, Any] = {
                k: spread([r[k] for r in runs], 0 if k.endswith("bytes") else 3) for k in keys
            }
            for what in ("first_s", "first_bytes", "second_s", "second_bytes", "restore_s"):
                figures[f"vs_tar_{what}"] = spread(
                    [r[f"rollcut_{what}"] / r[f"tar_{what}"] for r in runs if r[f"tar_{what}"]]
                )
            out["by_changed"][f"{percent:g}%"] = figures
    return out
