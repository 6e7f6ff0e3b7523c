"""No foreign exception escapes a public call: nats, lmdb, msgspec, zstd and httpx errors arrive
as rollcut errors that carry their coordinates, with the original as ``__cause__``."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import httpx
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollcut import (
    BusError,
    CheckpointFailedError,
    ConfigError,
    CorruptEventError,
    LedgerCorruptError,
    LedgerError,
    RollcutError,
    StaleCheckpointError,
    TokenStoreError,
)
from rollcut.bus import BusConfig, Codec, EventLog, TokenReceipt, load_credentials
from rollcut.collect import load_config
from rollcut.gym.wire import ErrorKind, GymError, error_from_response
from rollcut.ledger import Ledger
from rollcut.participants import ControlErrorKind, ControlReply
from rollcut.tokens import LocalTokenStore

from .helpers import model_event


def test_a_file_that_is_not_lmdb_is_a_ledger_error_naming_its_path(tmp_path: Path) -> None:
    (tmp_path / "data.mdb").write_bytes(b"not an lmdb file at all" * 100)
    with pytest.raises(LedgerCorruptError) as info:
        Ledger(tmp_path)
    assert info.value.path == str(tmp_path)
    assert "not an LMDB file" in str(info.value) and "rollcut ledger rebuild" in str(info.value)


def test_a_missing_ledger_read_only_is_a_ledger_error(tmp_path: Path) -> None:
    with pytest.raises(LedgerError) as info:
        Ledger(tmp_path / "nowhere", readonly=True)
    assert info.value.path == str(tmp_path / "nowhere")


def test_a_missing_token_record_names_the_store_and_receipt(tmp_path: Path) -> None:
    with LocalTokenStore(tmp_path) as store:
        receipt = TokenReceipt(receipt_id="missing", count=1, digest="ab" * 16)
        with pytest.raises(TokenStoreError) as info:
            store.get(receipt)
    assert (info.value.store, info.value.receipt_id) == (str(tmp_path), "missing")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_any_bytes_decode_to_an_event_or_a_rollcut_error(data: bytes) -> None:
    with contextlib.suppress(RollcutError):
        Codec().decode(data, seq=7, subject="rc.x.ev.r.1.model")


def test_a_corrupt_frame_names_its_seq_and_subject() -> None:
    frame = bytearray(Codec().encode(model_event("r1")))
    frame[-1] ^= 0xFF
    with pytest.raises(CorruptEventError) as info:
        Codec().decode(bytes(frame), stream="RC_x", seq=42, subject="rc.x.ev.r1.1.model")
    assert (info.value.stream, info.value.seq, info.value.subject) == ("RC_x", 42, "rc.x.ev.r1.1.model")


async def test_an_unreachable_server_is_a_bus_error() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BusError) as info:
        await EventLog.connect(BusConfig(url=f"nats://127.0.0.1:{port}", connect_timeout_s=0.5))
    assert info.value.__cause__ is not None
    assert not isinstance(info.value.__cause__, RollcutError)


def test_bad_config_and_credentials_files_are_config_errors(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("environment_url: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "c.yaml")
    assert isinstance(info.value.__cause__, msgspec.DecodeError)
    (tmp_path / "creds.json").write_text("{not json")
    with pytest.raises(ConfigError):
        load_credentials(tmp_path / "creds.json")


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/plain", b"Internal Server Error"),
        ("application/json", b"{not json"),
        ("application/json", b"[1]"),
    ],
)
def test_any_answer_of_another_server_maps_to_a_gym_error(content_type: str, body: bytes) -> None:
    resp = httpx.Response(500, headers={"content-type": content_type}, content=body)
    err = error_from_response(resp, where="http://agent/run")
    assert isinstance(err, GymError) and err.kind is ErrorKind.HTTP_ERROR and err.status == 500


def test_a_gym_error_answer_maps_back_to_its_kind() -> None:
    resp = httpx.Response(
        503,
        headers={"retry-after": "2"},
        json={"error": {"type": "admission_closed", "message": "closed for ck1"}},
    )
    err = error_from_response(resp)
    assert (err.kind, err.status, err.retry_after_s) == (ErrorKind.ADMISSION_CLOSED, 503, 2.0)


def test_a_stale_control_reply_is_a_stale_checkpoint_error_with_its_coordinates() -> None:
    reply = ControlReply(
        ok=False, op="commit", checkpoint_id="old", instance="res-0", error_kind=ControlErrorKind.STALE
    )
    err = reply.refusal()
    assert isinstance(err, StaleCheckpointError)
    assert (err.checkpoint_id, err.participant) == ("old", "res-0")
    busy = ControlReply(ok=False, op="prepare", checkpoint_id="new", instance="res-0", error_kind="busy")
    assert type(busy.refusal()) is CheckpointFailedError


def test_a_full_disk_under_the_rows_is_a_storage_error_naming_the_file() -> None:
    from rollcut import StorageError
    from rollcut.collect import Collector

    with pytest.raises(StorageError, match="/dev/full") as info:
        Collector._write_row(Path("/dev/full"), {"rollout_id": "r1"})  # ENOSPC, whoever we are
    assert info.value.errno == 28 and info.value.path == "/dev/full"


def test_an_lmdb_failure_of_the_disk_is_a_storage_error_and_others_are_not(tmp_path: Path) -> None:
    import errno

    import lmdb

    from rollcut import StorageError
    from rollcut._lmdb import storage_error

    full = storage_error(lmdb.Error("mdb_txn_commit: No space left on device"), tmp_path, "commit")
    assert isinstance(full, StorageError) and full.errno == errno.ENOSPC and full.path == str(tmp_path)
    assert (
        storage_error(lmdb.Error("mdb_put: MDB_MAP_FULL: Environment mapsize limit reached"), tmp_path, "x")
        is None
    )
