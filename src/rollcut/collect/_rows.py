"""Input rows, rollout identity, and the rows a collection writes: rollcut's format and NeMo Gym's.

A row is **NeMo Gym-shaped** when it has ``responses_create_params``; then:

- its task index is its ``_ng_task_index``, else the order in which distinct
  rows first appear (NeMo Gym's own rule), and each of its ``num_repeats``
  rollouts is ``<task index>-<repeat>`` (NeMo Gym's ``"{task}-{rollout}"``);
- ``/run`` gets the row plus ``_ng_task_index``, ``_ng_rollout_index``,
  ``_ng_rollout_id`` and ``_ng_attempt_index`` (the attempt, counted from 0);
- its output row is what ``/run`` returned (the verify response: the row, the
  whole ``response``, ``reward``) with those ``_ng_*`` fields set for the
  attempt that finished, and rollcut's ``rollout_id`` and ``attempt`` beside them;
- a rollout that failed for good (retired, or out of attempts) gets one row in
  the sidecar ``<output stem>_failures.jsonl`` instead, with
  ``_ng_failure_class`` and ``_ng_failure_terminal`` as NeMo Gym writes them.

Otherwise the row is **rollcut's** (``{"id", "env", "prompt", "seed", ...}``): the
rollout is ``<id>-<repeat>``, ``/run`` gets the row as it is, and the output row
is rollcut's summary (retired rollouts included, marked ``retired``).

Every rollout has exactly one row across the output and its sidecar.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from .._errors import ConfigError
from .._files import write_private
from ..bus import input_digest
from ._index import Inputs, RolloutInput, is_nemo_row

__all__ = ["RolloutInput", "Rows", "failures_path", "is_nemo_row", "load_rows", "read_rows", "row_kept"]


def failures_path(output: Path) -> Path:
    """The sidecar for rollouts that failed for good, next to ``output`` (NeMo Gym's naming)."""
    return output.with_name(output.stem + "_failures.jsonl")


def load_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """A tasks file's rows with their line numbers; a line that is not a JSON object is a ConfigError
    naming it."""
    return list(read_rows(path))


def read_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """:func:`load_rows` one line at a time (a million tasks need not be in memory at once)."""
    try:
        f = path.open("rb")
    except OSError as exc:
        raise ConfigError(f"cannot read tasks {path}: {exc.strerror or exc}") from exc
    with f:
        yield from _lines(path, f, "a JSON object")


def _cut_torn_tail(path: Path, chunk: int = 1 << 16) -> int:
    """Cut a last line without its newline off ``path``; how many bytes went."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        end = size
        while end > 0:
            start = max(0, end - chunk)
            f.seek(start)
            at = f.read(end - start).rfind(b"\n")
            if at >= 0:
                keep = start + at + 1
                break
            end = start
        else:
            keep = 0
    os.truncate(path, keep)
    return size - keep


def _lines(path: Path, f: BinaryIO, what: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each non-blank line's JSON object with its line number, read one line at a time; any other
    line is a ConfigError naming the file, the line and ``what`` it should have been."""
    for n, raw in enumerate(f, start=1):
        try:
            line = raw.decode()
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path} line {n} is not UTF-8 text: {exc.reason}") from exc
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ConfigError(f"{path} line {n} is not {what}: {exc}") from exc
        if not isinstance(row, dict):
            raise ConfigError(f"{path} line {n} is not {what}")
        yield n, row


class Rows:
    """The rollouts of a collection's input rows, and the rows it writes for them."""

    def __init__(
        self,
        tasks: Iterable[dict[str, Any]],
        num_repeats: int | Callable[[dict[str, Any]], int],
        output: Path,
        *,
        lines: Iterable[int] | None = None,
    ) -> None:
        self.output = output
        self.failures = failures_path(output)
        self.ownership = output.with_name(output.name + ".collection.json")
        self.torn_bytes = 0  # a torn last row cut off the output at load (it was never acknowledged)
        # spilled to disk beside the output when large: a week's inputs do not fit in memory
        self.inputs = Inputs(tasks, num_repeats, lines=lines, near=output.parent)

    def close(self) -> None:
        """Delete the index of the inputs."""
        self.inputs.close()

    def run_body(self, rid: str, attempt: int) -> dict[str, Any]:
        """What the environment server's ``/run`` gets for this attempt."""
        inp = self.inputs[rid]
        return {**inp.row, **inp.ng_fields(attempt)} if inp.nemo else inp.row

    def result_row(self, rid: str, attempt: int, result: dict[str, Any]) -> dict[str, Any]:
        """The output row of a finished rollout."""
        inp = self.inputs[rid]
        if inp.nemo:
            return {
                **result,
                **inp.ng_fields(attempt),
                "rollout_id": rid,
                "attempt": attempt,
                **policy_span(result),
            }
        return {
            "rollout_id": rid,
            "attempt": attempt,
            "task_id": inp.row.get("id"),
            "reward": result.get("reward"),
            "turns": result.get("turns"),
            "answer": result.get("answer"),
            "continued": result.get("continued", False),
            "status": "completed",
            # the receipts of its model calls, where the agent reports them (an opaque agent's launcher)
            **({"rollcut": result["rollcut"]} if "rollcut" in result else {}),
        }

    def failure_row(self, rid: str, attempt: int, reason: str) -> tuple[Path, dict[str, Any]]:
        """Where a rollout that failed for good is written, and its row."""
        inp = self.inputs[rid]
        if inp.nemo:
            row = {
                **inp.row,
                **inp.ng_fields(attempt),
                "rollout_id": rid,
                "attempt": attempt,
                "_ng_failure_class": "retired",
                "_ng_failure_terminal": True,
                "reason": reason,
            }
            return self.failures, row
        row = {
            "rollout_id": rid,
            "attempt": attempt,
            "task_id": inp.row.get("id"),
            "status": "retired",
            "reason": reason,
        }
        return self.output, row

    def claim(self, namespace: str) -> None:
        """The output belongs to one collection (its namespace): refuse one that belongs to another,
        or that holds rows nobody can vouch for; else record the claim beside it."""
        if self.ownership.exists():
            owner = json.loads(self.ownership.read_text()).get("namespace")
            if owner != namespace:
                raise ConfigError(
                    f"{self.output} belongs to the collection of namespace {owner!r}, not {namespace!r}: "
                    "name another output"
                )
            return
        for path in (self.output, self.failures):
            if path.exists() and path.is_file() and path.stat().st_size:
                raise ConfigError(
                    f"{path} already holds rows of an unknown collection: name another output or move it"
                )
        write_private(self.ownership, json.dumps({"schema_version": 1, "namespace": namespace}).encode())

    def written(self) -> Iterator[dict[str, Any]]:
        """Every row already written, output and sidecar, each of this collection's rollouts, read one
        line at a time (a week's rows hold every episode's token ids: they do not fit in memory). A
        torn last line (a crash or a full disk mid-write: never acknowledged) is cut off first; any
        other bad line is an error naming it."""
        for path in (self.output, self.failures):
            if path.exists() and not path.is_file():
                raise ConfigError(f"the output {path} exists and is not a regular file: name a file")
            if not path.exists():
                continue
            self.torn_bytes += _cut_torn_tail(path)
            with path.open("rb") as f:
                for n, row in _lines(path, f, "a row"):
                    if row.get("rollout_id") not in self.inputs:
                        raise ConfigError(f"{path} line {n} is not a row of this collection's rollouts")
                    yield row


def policy_span(result: dict[str, Any]) -> dict[str, int]:
    """``version_start`` / ``version_end``: the oldest and newest policy version that generated any
    token of the rollout (from its output items' ``policy_segments``); nothing when none says."""
    versions = [
        int(seg["version"])
        for item in (result.get("response") or {}).get("output") or []
        if isinstance(item, dict)
        for seg in item.get("policy_segments") or []
        if isinstance(seg, dict) and isinstance(seg.get("version"), int)
    ]
    return {"version_start": min(versions), "version_end": max(versions)} if versions else {}


def row_kept(row: dict[str, Any]) -> tuple[str, float]:
    """What the collector keeps of a written row: its digest and reward (what an acceptance binds;
    the row itself holds the whole episode with its token ids, and a week's rows do not fit in memory)."""
    return input_digest(row), float(row.get("reward") or 0.0)
