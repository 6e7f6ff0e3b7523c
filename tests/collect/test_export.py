"""The trainer export of rows that name only their receipts (an opaque agent's): the arrays are the
token store's records, and a receipt the store does not vouch for is an error, never a sample. Rows
whose records compaction released are checked against what the store kept of them."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from rollcut.bus import TokenReceipt
from rollcut.collect import ExportError, read_turns
from rollcut.tokens import LocalTokenStore, TokenRecord


def _row(rid: str, receipts: list[dict[str, object]]) -> dict[str, object]:
    return {
        "rollout_id": rid,
        "attempt": 2,
        "reward": 1.0,
        "status": "completed",
        "rollcut": {"model_calls": receipts},
    }


def _call(store: LocalTokenStore, call_id: str, prompt: list[int], out: list[int]) -> dict[str, object]:
    receipt = store.put(call_id, TokenRecord(prompt_ids=prompt, output_ids=out, logprobs=[-0.5] * len(out)))
    return {
        "call_id": call_id,
        "receipt_id": receipt.receipt_id,
        "receipt_digest": receipt.digest,
        "receipt_count": receipt.count,
    }


def test_receipts_only_rows_export_the_stores_arrays(tmp_path: Path) -> None:
    with LocalTokenStore(tmp_path / "tokens") as store:
        calls = [_call(store, "c1", [1, 2, 3], [7, 8]), _call(store, "c2", [1, 2, 3, 7, 8, 4], [9])]
        rows = tmp_path / "rows.jsonl"
        rows.write_text(json.dumps(_row("r", calls)) + "\n")
        turns = list(read_turns(rows, store))
    assert [(t.turn, t.input_ids, t.mask) for t in turns] == [
        (1, [1, 2, 3, 7, 8], [0, 0, 0, 1, 1]),
        (2, [1, 2, 3, 7, 8, 4, 9], [0, 0, 0, 0, 0, 0, 1]),
    ]
    assert turns[0].log_probs == [0.0, 0.0, 0.0, -0.5, -0.5] and turns[0].attempt == 2


def test_a_receipt_the_store_does_not_vouch_for_is_refused_naming_the_turn(tmp_path: Path) -> None:
    with LocalTokenStore(tmp_path / "tokens") as store:
        good = _call(store, "c1", [1], [2])
        forged = {**_call(store, "c2", [1, 2], [3]), "receipt_digest": "00" * 16}
        rows = tmp_path / "rows.jsonl"
        rows.write_text(json.dumps(_row("r", [good, forged])) + "\n")
        with pytest.raises(ExportError, match="r turn 2") as caught:
            list(read_turns(rows, store))
    assert (caught.value.rollout_id, caught.value.turn) == ("r", 2)


def test_a_row_with_neither_arrays_nor_receipts_is_refused(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(_row("r", [])) + "\n")
    with LocalTokenStore(tmp_path / "tokens") as store, pytest.raises(ExportError, match="no token arrays"):
        list(read_turns(rows, store))


def _with_arrays(row: dict[str, object], store: LocalTokenStore, calls: list[dict[str, object]]) -> None:
    """The row as a collection with token ids on writes it: each call's arrays on its output item."""
    items = []
    for c in calls:
        rec = store.get(
            TokenReceipt(
                receipt_id=str(c["receipt_id"]),
                count=int(str(c["receipt_count"])),
                digest=str(c["receipt_digest"]),
            )
        )
        items.append(
            {
                "type": "message",
                "prompt_token_ids": rec.prompt_ids,
                "generation_token_ids": rec.output_ids,
                "generation_log_probs": rec.logprobs,
                "policy_segments": [msgspec.structs.asdict(s) for s in rec.spans()],
            }
        )
    row["response"] = {"output": items}


def test_rows_whose_records_compaction_released_export_checked_against_what_the_store_kept(
    tmp_path: Path,
) -> None:
    with LocalTokenStore(tmp_path / "tokens") as store:
        calls = [_call(store, "c1", [1, 2, 3], [7, 8]), _call(store, "c2", [1, 2, 3, 7, 8, 4], [9])]
        row = _row("r", calls)
        _with_arrays(row, store, calls)
        rows = tmp_path / "rows.jsonl"
        rows.write_text(json.dumps(row) + "\n")
        before = list(read_turns(rows, store))
        assert store.release(["c1", "c2"]).records_released == 2
        after = list(read_turns(rows, store))
        assert after == before  # the same turns, policy versions included, with the records gone

        output = row["response"]["output"]  # type: ignore[index]
        output[1]["generation_token_ids"] = [10]  # a row changed after the hand-off
        rows.write_text(json.dumps(row) + "\n")
        with pytest.raises(ExportError, match="kept of released record") as caught:
            list(read_turns(rows, store))
        assert (caught.value.rollout_id, caught.value.turn) == ("r", 2)

        receipts_only = tmp_path / "opaque.jsonl"  # an opaque agent's row: nothing to check but the store
        receipts_only.write_text(json.dumps(_row("r", calls)) + "\n")
        with pytest.raises(ExportError, match="released by compaction"):
            list(read_turns(receipts_only, store))
