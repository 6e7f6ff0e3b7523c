"""The trainer-side reader: a collection's rows as per-turn token arrays, checked against custody.

Each model call of a rollout is one **turn**: the prompt the model saw and the
tokens it generated, with a log-prob per generated token. A turn's sequence
is ``prompt_token_ids + generation_token_ids``; its mask is 0 over the
prompt (user, system and tool tokens: not the policy's) and 1 over the
generation; its log-probs are 0.0 over the prompt; its versions are the policy
version that generated each token, -1 over the prompt (AReaL's convention), so a
call cut before a weight update and continued after it shows both versions.

The arrays come from the row (NeMo Gym's training fields on the output
items), and every turn is checked against the token store: the row names
each call's receipt (``rollcut.model_calls``), the store's record behind it
must pass its digest, and must hold exactly the row's arrays. A row whose
arrays the store does not vouch for is an error naming the rollout and
turn, never a silently trained-on sample. An opaque agent's row (rollcut's
format, or NeMo Gym's with ``rollcut.transcript: "journal"``: its Response is
the answer's, the episode is the relay's journal) names only the receipts: its
arrays are the store's records, each verified against its receipt's digest.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from .._errors import RollcutError, TokenStoreError
from ..bus import TokenReceipt
from ..tokens import Releasable, TokenRecord, TokenSource, VersionSegment, arrays_digest

if TYPE_CHECKING:
    import numpy as np

__all__ = ["ExportError", "Turn", "padded", "read_turns"]

_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


class ExportError(RollcutError):
    """A row's token arrays are missing, or do not match the token store's record."""

    rollout_id: str | None = None
    turn: int | None = None


@dataclass(frozen=True)
class Turn:
    """One model call of one rollout, ready for a trainer."""

    rollout_id: str
    attempt: int
    """The attempt whose row this is (a continued rollout's turns may come from earlier ones)."""
    turn: int
    """The model call's place in the rollout, from 0."""
    reward: float
    """The rollout's reward, on each of its turns."""
    prompt_ids: list[int]
    """What the model was given, as the token store recorded it (not retokenised)."""
    generation_ids: list[int]
    generation_log_probs: list[float]
    """The policy's log-prob of each generated token."""
    generation_versions: list[int]
    """The policy version that generated each token (a weight update mid-call shows here)."""

    @property
    def input_ids(self) -> list[int]:
        """The whole sequence: prompt, then generation."""
        return self.prompt_ids + self.generation_ids

    @property
    def mask(self) -> list[int]:
        """1 where the policy generated the token, 0 where it was given (prompt, tools, user)."""
        return [0] * len(self.prompt_ids) + [1] * len(self.generation_ids)

    @property
    def log_probs(self) -> list[float]:
        """The policy's log-prob per token, 0.0 where it did not generate it."""
        return [0.0] * len(self.prompt_ids) + list(self.generation_log_probs)

    @property
    def versions(self) -> list[int]:
        """The policy version that generated each token, -1 where the policy did not."""
        return [-1] * len(self.prompt_ids) + list(self.generation_versions)

    def as_dict(self) -> dict[str, Any]:
        """One JSON line of ``rollcut export --format jsonl``."""
        return {
            "rollout_id": self.rollout_id,
            "attempt": self.attempt,
            "turn": self.turn,
            "reward": self.reward,
            "input_ids": self.input_ids,
            "mask": self.mask,
            "log_probs": self.log_probs,
            "versions": self.versions,
        }


def _row_turns(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The model calls' arrays in the row's output, in order: items of one call carry the same arrays."""
    turns: list[dict[str, Any]] = []
    for item in (row.get("response") or {}).get("output") or []:
        if not isinstance(item, dict) or not all(f in item for f in _FIELDS):
            continue
        arrays = {f: item[f] for f in _FIELDS}
        if "policy_segments" in item:
            arrays["policy_segments"] = item["policy_segments"]
        if not turns or turns[-1] != arrays:
            turns.append(arrays)
    return turns


def read_turns(rows: Path, tokens: TokenSource) -> Iterator[Turn]:
    """Every turn of every completed rollout in ``rows`` (NeMo Gym's format, or rollcut's with receipts),
    checked against ``tokens``. A row that is not JSON, not an object, names a rollout an earlier row
    named (a trainer would consume it twice), has a reward that is not a finite number, or is
    malformed anywhere is an :class:`ExportError` naming its line: nothing of it is exported."""
    seen: dict[str, int] = {}
    with rows.open("rb") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{rows}:{line_no}"
            row = _decoded(line, where)
            rid = str(row.get("rollout_id", f"line {line_no}"))
            if rid in seen:
                raise ExportError(
                    f"{where} ({rid}): the rollout's row is also at line {seen[rid]}; each rollout is "
                    "exported once",
                    rollout_id=rid,
                )
            seen[rid] = line_no
            try:
                yield from _turns(row, rid, where, tokens)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise ExportError(f"{where} ({rid}): malformed row: {exc!r}", rollout_id=rid) from exc


def _decoded(line: bytes, where: str) -> dict[str, Any]:
    try:
        row = msgspec.json.decode(line)  # bounded: no NaN or Infinity, no nesting past msgspec's limit
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ExportError(f"{where}: not a JSON row: {exc}") from exc
    if not isinstance(row, dict):
        raise ExportError(f"{where}: a row is a JSON object, got {type(row).__name__}")
    return row


def _reward(row: dict[str, Any], where: str, rid: str) -> float:
    value = row.get("reward") or 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ExportError(f"{where} ({rid}): reward {value!r} is not a finite number", rollout_id=rid)
    return float(value)


def _turns(row: dict[str, Any], rid: str, where: str, tokens: TokenSource) -> Iterator[Turn]:
    reward = _reward(row, where, rid)
    calls = (row.get("rollcut") or {}).get("model_calls") or []
    turns = _row_turns(row)
    journal = (row.get("rollcut") or {}).get("transcript") == "journal"  # an opaque agent's row
    if not turns and calls and ("response" not in row or journal):  # receipts only: the store's arrays
        turns = [dict.fromkeys(_FIELDS) for _ in calls]
    if not turns:
        raise ExportError(
            f"{where} ({rid}): no token arrays on the output items; collect with the model "
            "server's --return-token-ids",
            rollout_id=rid,
        )
    if len(calls) != len(turns):
        raise ExportError(
            f"{where} ({rid}): {len(turns)} turns but {len(calls)} model-call receipts",
            rollout_id=rid,
        )
    for i, (call, arrays) in enumerate(zip(calls, turns, strict=True), start=1):
        receipt = TokenReceipt(
            receipt_id=call["receipt_id"],
            count=int(
                call["receipt_count"] if "receipt_count" in call else len(arrays["generation_token_ids"])
            ),
            digest=call["receipt_digest"],
        )
        stored, segments = _custody(tokens, receipt, arrays, rid, i)
        if arrays["prompt_token_ids"] is not None and (
            stored != tuple(arrays[f] for f in _FIELDS) or arrays.get("policy_segments", segments) != segments
        ):
            raise ExportError(
                f"{rid} turn {i}: the row's token arrays differ from the token store's record "
                f"{receipt.receipt_id}",
                rollout_id=rid,
                turn=i,
            )
        versions = TokenRecord(
            prompt_ids=[], output_ids=stored[1], segments=[VersionSegment(**seg) for seg in segments]
        ).versions()
        yield Turn(
            rollout_id=rid,
            attempt=int(row.get("attempt", 1)),
            turn=i,
            reward=reward,
            prompt_ids=stored[0],
            generation_ids=stored[1],
            generation_log_probs=stored[2],
            generation_versions=versions,
        )


def _custody(
    tokens: TokenSource, receipt: TokenReceipt, arrays: dict[str, Any], rid: str, turn: int
) -> tuple[tuple[list[int], list[int], list[float]], list[dict[str, Any]]]:
    """A turn's arrays and segments as custody vouches for them: the store's record (checked against
    its receipt's digest), or, for a record compaction released, the row's own arrays if they match
    the digest the store kept of them."""
    try:
        record = tokens.get(receipt)  # checks the record against the receipt's digest
    except TokenStoreError as exc:
        kept = tokens.released(receipt) if isinstance(tokens, Releasable) else None
        if kept is None:
            raise ExportError(f"{rid} turn {turn}: {exc}", rollout_id=rid, turn=turn) from exc
        if arrays["prompt_token_ids"] is None:
            raise ExportError(
                f"{rid} turn {turn}: the record of receipt {receipt.receipt_id} was released by compaction "
                "and the row names receipts only (an opaque agent's): export before compacting, or "
                "compact with compaction.release_tokens false",
                rollout_id=rid,
                turn=turn,
            ) from exc
        row_arrays = tuple(arrays[f] for f in _FIELDS)
        if arrays_digest(*row_arrays) != kept.arrays_digest:
            raise ExportError(
                f"{rid} turn {turn}: the row's token arrays differ from what the token store kept of "
                f"released record {receipt.receipt_id}",
                rollout_id=rid,
                turn=turn,
            ) from exc
        return row_arrays, [msgspec.structs.asdict(s) for s in kept.segments]
    stored = (list(record.prompt_ids), list(record.output_ids), list(record.logprobs))
    return stored, [msgspec.structs.asdict(s) for s in record.spans()]


def padded(turns: list[Turn], *, pad_id: int = 0) -> dict[str, np.ndarray]:
    """Turns as right-padded arrays: ``input_ids``, ``mask``, ``log_probs``, ``versions`` (-1 where
    the policy did not generate, and in the padding) ``[n, longest]``, ``lengths``
    and ``rewards`` ``[n]`` (numpy, imported only here)."""
    import numpy as np

    width = max((len(t.input_ids) for t in turns), default=0)
    ids = np.full((len(turns), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(turns), width), dtype=np.int8)
    log_probs = np.zeros((len(turns), width), dtype=np.float32)
    versions = np.full((len(turns), width), -1, dtype=np.int64)
    for i, t in enumerate(turns):
        n = len(t.input_ids)
        ids[i, :n], mask[i, :n], log_probs[i, :n] = t.input_ids, t.mask, t.log_probs
        versions[i, :n] = t.versions
    return {
        "input_ids": ids,
        "mask": mask,
        "log_probs": log_probs,
        "versions": versions,
        "lengths": np.array([len(t.input_ids) for t in turns], dtype=np.int64),
        "rewards": np.array([t.reward for t in turns], dtype=np.float32),
    }
