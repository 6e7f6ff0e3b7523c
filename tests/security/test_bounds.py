"""Finding 3: decompression bombs and oversized bodies never cost more than the limit."""

from __future__ import annotations

import tracemalloc
import zlib
from pathlib import Path

import httpx
import msgspec
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from rollcut import CorruptEventError, EventTooLargeError, RollcutError
from rollcut.bus import Codec, EventLog
from rollcut.gym.resources import Counter, ResourcesService, create_resources_app
from rollcut.gym.wire import ErrorKind, GymError, identity_from

from ..helpers import model_event, mutation_event


def _frame(body: bytes, *, compressed: bool) -> bytes:
    flags = 1 if compressed else 0
    return b"rc" + bytes((1, flags)) + zlib.crc32(body).to_bytes(4, "big") + body


@pytest.mark.parametrize("declared", [True, False], ids=["size-declared", "size-undeclared"])
def test_a_zstd_bomb_is_refused_before_it_inflates(declared: bool) -> None:
    bomb = msgspec.msgpack.encode({"kind": "model.admitted", "pad": b"\0" * (256 << 20)})  # 256 MiB
    packed = zstandard.ZstdCompressor(level=3, write_content_size=declared).compress(bomb)
    assert len(packed) < 64 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(CorruptEventError, match="limit"):
            Codec().decode(_frame(packed, compressed=True), seq=9, subject="rc.x.ev.r.1.model")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * Codec().max_event_bytes  # bounded by the limit, not by what the frame claims


def test_the_size_limit_applies_to_the_decoded_event() -> None:
    codec = Codec(max_event_bytes=64 * 1024)
    compressible = mutation_event(state=b"\0" * (1 << 20))  # tiny once compressed, 1 MiB decoded
    with pytest.raises(EventTooLargeError):
        codec.encode(compressible)
    plain = msgspec.msgpack.encode(msgspec.to_builtins(model_event("r")) | {"pad": "x" * (128 * 1024)})
    with pytest.raises(CorruptEventError, match="limit"):
        codec.decode(_frame(plain, compressed=False))


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=512),
        st.builds(
            lambda b, z: _frame(zstandard.compress(b) if z else b, compressed=z),
            st.binary(max_size=512),
            st.booleans(),
        ),
        st.builds(
            lambda i, v: _mutate(Codec().encode(model_event("r1", call_id="c1")), i, v),
            st.integers(min_value=0, max_value=200),
            st.integers(min_value=0, max_value=255),
        ),
    )
)
def test_any_frame_decodes_or_is_a_clear_rollcut_error(frame: bytes) -> None:
    try:
        Codec().decode(frame, seq=1, subject="rc.x.ev.r1.1.model")
    except RollcutError as exc:
        assert str(exc)


def _maybe_packed(body: bytes, packed: bool) -> bytes:
    return _frame(zstandard.compress(body) if packed else body, compressed=packed)


def _mutate(frame: bytes, index: int, value: int) -> bytes:
    out = bytearray(frame)
    out[index % len(out)] = value
    return bytes(out)


async def test_an_oversized_http_body_is_413_and_nothing_is_stored(log: EventLog, tmp_path: Path) -> None:
    app = create_resources_app(ResourcesService(log, Counter(), instance="counter-w0"), max_body_bytes=4096)
    await log.dispatch("r-big", {}, instance="collector")
    before = await log.last_seq()
    headers = {"x-rollout-id": "r-big", "x-rollout-attempt": "1"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://res") as client:
        declared = await client.post("/seed_session", content=b"{" + b" " * 10_000 + b"}", headers=headers)
        assert declared.status_code == 413 and declared.json()["error"]["code"] == "payload_too_large"

        async def chunks():  # no Content-Length: counted as it arrives
            for _ in range(10):
                yield b" " * 1024

        streamed = await client.post("/seed_session", content=chunks(), headers=headers)
        assert streamed.status_code == 413
        small = await client.post("/seed_session", json={"start": 1}, headers=headers)
        assert small.status_code == 200
    assert await log.last_seq() == before + 1  # only the small seeding was stored


@pytest.mark.parametrize(
    "attempt", ["0", "-5", "x", "+1", "1_0", " 1", "\u0661", "99999999999999999999", "1000001"]
)
def test_an_attempt_that_is_not_a_plain_storable_number_is_a_bad_identity(attempt: str) -> None:
    """What the fuzz found: a 20-digit attempt passed and then could not be stored (a 500)."""
    with pytest.raises(GymError) as refused:
        identity_from({"x-rollout-id": "r1", "x-rollout-attempt": attempt})
    assert refused.value.kind is ErrorKind.BAD_IDENTITY and refused.value.status == 400
    assert identity_from({"x-rollout-id": "r1", "x-rollout-attempt": "1000000"}).attempt == 1_000_000
