"""Schema and codec: unit tests, no server."""

from __future__ import annotations

import os

import msgspec
import pytest

from rollcut import (
    CorruptEventError,
    EventTooLargeError,
    SchemaError,
    SchemaVersionError,
    UnknownEventKindError,
)
from rollcut.bus import SCHEMA_VERSION, Codec, ModelCallAdmitted

from ..helpers import model_event, mutation_event, raw_frame


def test_roundtrip_preserves_every_field() -> None:
    codec = Codec()
    ev = model_event("r1", parent_call_id="c0")
    assert codec.decode(codec.encode(ev)) == ev


def test_large_payload_is_compressed_and_small_is_not() -> None:
    codec = Codec(compress_threshold=256)
    small = model_event("r1")
    big = mutation_event(result={"text": "lorem ipsum " * 500})
    assert codec.encode(small)[3] == 0
    frame = codec.encode(big)
    assert frame[3] & 1
    assert len(frame) < len(msgspec.msgpack.encode(big))
    assert codec.decode(frame) == big


def test_bad_field_is_refused_naming_field_and_rule() -> None:
    with pytest.raises(SchemaError, match=r"rollout_id") as info:
        Codec().encode(model_event("bad.id"))
    assert "regex" in str(info.value)
    with pytest.raises(SchemaError, match=r"\$\.attempt"):
        Codec().encode(model_event("r1", attempt=0))


def test_flipped_byte_is_detected_with_its_position() -> None:
    codec = Codec()
    frame = bytearray(codec.encode(model_event("r1")))
    frame[-3] ^= 0xFF
    with pytest.raises(CorruptEventError, match="checksum") as info:
        codec.decode(bytes(frame), stream="S", seq=42, subject="rc.x.ev.r1.1.model")
    assert info.value.seq == 42
    assert "seq 42" in str(info.value)


def test_foreign_bytes_are_named_as_such() -> None:
    with pytest.raises(CorruptEventError, match="not a rollcut frame"):
        Codec().decode(b"hello world, not a frame at all")


def test_unknown_kind_is_named() -> None:
    raw = msgspec.to_builtins(model_event("r1"))
    raw["kind"] = "teleport.started"
    with pytest.raises(UnknownEventKindError, match=r"teleport\.started"):
        Codec().decode(raw_frame(raw))


def test_newer_schema_version_is_refused() -> None:
    raw = msgspec.to_builtins(model_event("r1"))
    raw["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(SchemaVersionError, match=f"schema_version {SCHEMA_VERSION + 1}"):
        Codec().decode(raw_frame(raw))


def test_older_schema_version_is_upcast_step_by_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend today's schema is 2, where v1 called the field `digest`: v1 records upcast."""
    import rollcut.bus._codec as codec_mod

    monkeypatch.setattr(codec_mod, "SCHEMA_VERSION", 2)
    raw = msgspec.to_builtins(model_event("r1"))
    raw["schema_version"] = 1
    raw["digest"] = raw.pop("request_digest")

    def v1_to_v2(d: dict[str, object]) -> dict[str, object]:
        d = dict(d)
        d["request_digest"] = d.pop("digest")
        return d

    with pytest.raises(SchemaError, match="no upcaster from schema_version 1"):
        Codec().decode(raw_frame(raw))
    ev = Codec(upcasters={("model.admitted", 1): v1_to_v2}).decode(raw_frame(raw))
    assert isinstance(ev, ModelCallAdmitted)
    assert ev.request_digest == "ab" * 8
    assert ev.schema_version == 2


def test_oversize_event_is_refused_before_sending() -> None:
    codec = Codec(max_event_bytes=4096)
    huge = mutation_event(state=os.urandom(8192))
    with pytest.raises(EventTooLargeError, match=r"resources\.mutated") as info:
        codec.encode(huge)
    assert info.value.size > 4096


def test_nested_id_is_checked_on_write_with_its_path() -> None:
    from rollcut.bus import ModelCallCompleted, TokenReceipt

    ev = ModelCallCompleted(
        component="model",
        instance="m",
        rollout_id="r1",
        attempt=1,
        call_id="c1",
        request_digest="ab" * 8,
        receipt=TokenReceipt(receipt_id="../../etc/passwd", count=1, digest="cd" * 8),
    )
    with pytest.raises(SchemaError, match=r"\$\.receipt\.receipt_id"):
        Codec().encode(ev)
