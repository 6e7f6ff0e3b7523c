"""Findings 1 and 2: forged lifecycle records and poisoned records, attacked with a role's own credentials.

Each test runs the attack as its own client and asserts what the system then believes.
"""

from __future__ import annotations

import msgspec
import pytest

from rollcut import SchemaError
from rollcut.bus import (
    BusConfig,
    CheckpointCommitted,
    Codec,
    Credentials,
    EmbeddedServer,
    EventLog,
    ResultAccepted,
    RolloutRetired,
)
from rollcut.ledger import Ledger, Projector, rebuild_ledger
from rollcut.participants import Coordinator, plan_recovery
from rollcut.replay import replay
from rollcut.tokens import LocalTokenStore

from ..helpers import model_event, raw_frame

DIGEST = "ab" * 8


async def test_forged_lifecycle_records_on_a_participants_own_subject_are_quarantined(
    server: EmbeddedServer, creds: Credentials, admin: EventLog, raw_as: object, tmp_path: object
) -> None:
    await admin.dispatch("victim", {"task": 1}, instance="collector-0")
    nc = await raw_as(server, creds, "model", "model-w0")  # type: ignore[operator]
    js = nc.jetstream()
    codec = Codec()
    own = admin.subjects.event("victim", 1, "model", "model-w0")  # model-w0 may publish here
    forged = [
        RolloutRetired(component="collector", instance="c", rollout_id="victim", attempt=1, reason="forged"),
        ResultAccepted(
            component="collector", instance="c", rollout_id="victim", attempt=1, result_digest="ab" * 8
        ),
        CheckpointCommitted(
            component="coordinator", instance="coordinator", checkpoint_id="ck-forged", cut=1
        ),
    ]
    for ev in forged:
        await js.publish(own, codec.encode(ev))  # stored: the server checks the subject, not the body
    state = (await replay(admin, rollout_id="victim")).rollouts["victim"]
    assert state.retired is None and state.accepted is None and len(state.corrupt_seqs) == 3
    with Ledger(tmp_path / "ledger") as led:  # type: ignore[operator]
        await Projector(led, admin).catch_up()
        rec = led.rollout("victim")
        assert rec is not None and rec.accepted_seq is None and rec.retired_seq is None
        assert rec.status != "accepted" and len(rec.corrupt_seqs) == 3
        assert led.checkpoint("ck-f") is None  # no forged entry in the restore catalog
        plan = await plan_recovery(admin, led, ["victim"])
        assert "victim" not in plan.completed and "victim" in plan.fresh_dispatch  # its row will be written


async def test_headers_a_writer_puts_on_its_record_do_not_change_where_it_is_read_from(
    server: EmbeddedServer, creds: Credentials, admin: EventLog, raw_as: object
) -> None:
    """The reader takes a record's subject and sequence from the server's reply headers, which
    the server sets by name: a writer claiming another rollout's fence in its own headers gets
    its record read where it is stored (a lifecycle kind there: quarantined in its own rollout)."""
    await admin.dispatch("victim", {"task": 1}, instance="collector-0")
    await admin.dispatch("writer", {"task": 2}, instance="collector-0")
    nc = await raw_as(server, creds, "model", "model-w0")  # type: ignore[operator]
    own = admin.subjects.event("writer", 1, "model", "model-w0")
    forged = RolloutRetired(component="collector", instance="c", rollout_id="victim", attempt=1, reason="x")
    ack = await nc.jetstream().publish(
        own,
        Codec().encode(forged),
        headers={"Nats-Subject": admin.subjects.fence("victim"), "Nats-Sequence": "1"},
    )
    stored = [s async for s in admin.read(strict=False) if s.seq == ack.seq]
    assert [(s.seq, s.subject) for s in stored] == [(ack.seq, own)]
    assert stored[0].event is None and "authority" in str(stored[0].error)
    state = await replay(admin)
    assert state.rollouts["victim"].retired is None and not state.rollouts["victim"].corrupt_seqs
    assert state.rollouts["writer"].corrupt_seqs == [ack.seq]


async def test_a_writer_cannot_claim_a_kind_its_subject_may_not_carry(
    server: EmbeddedServer, creds: Credentials, admin: EventLog
) -> None:
    await admin.dispatch("r-claim", {}, instance="collector-0")
    model = await EventLog.connect(BusConfig(url=server.url, request_timeout_s=5).as_role(creds, "model"))
    try:
        before = await admin.last_seq()
        claim = ResultAccepted(
            component="model", instance="m", rollout_id="r-claim", attempt=1, result_digest="ab" * 8
        )
        with pytest.raises(SchemaError, match=r"may not write result\.accepted"):
            await model.append(claim)
        assert await admin.last_seq() == before  # refused before anything was sent
    finally:
        await model.close()


def _raw(kind: str | None = None, **overrides: object) -> bytes:
    raw = msgspec.to_builtins(model_event("r-bad"))
    if kind is not None:
        raw["kind"] = kind
    raw.update(overrides)
    return raw_frame(raw)


@pytest.mark.parametrize(
    "frame",
    [_raw("hologram.emitted"), _raw(schema_version=99), _raw(attempt=-3), b"\x00garbage"],
    ids=["unknown-kind", "newer-version", "invalid-field", "garbage"],
)
async def test_a_bad_record_on_a_rollout_costs_that_rollout_only(
    server: EmbeddedServer,
    creds: Credentials,
    admin: EventLog,
    raw_as: object,
    tmp_path: object,
    frame: bytes,
) -> None:
    await admin.dispatch("r-bad", {}, instance="collector-0")
    await admin.dispatch("r-good", {}, instance="collector-0")
    await admin.append(model_event("r-good"))
    nc = await raw_as(server, creds, "model", "model-w0")  # type: ignore[operator]
    await nc.jetstream().publish(admin.subjects.event("r-bad", 1, "model", "model-w0"), frame)
    result = await replay(admin)  # the whole namespace still replays
    assert result.rollouts["r-bad"].corrupt_seqs and not result.rollouts["r-good"].corrupt_seqs
    with Ledger(tmp_path / "ledger") as led, LocalTokenStore(tmp_path / "tokens") as tokens:  # type: ignore[operator]
        await Projector(led, admin).catch_up()  # ledger status
        assert led.rollout("r-bad").corrupt_seqs  # type: ignore[union-attr]
        await Coordinator(admin, led, tokens).checkpoint(deadline_s=5)  # checkpoints go on
    n, _ = await rebuild_ledger(admin, tmp_path / "rebuilt")  # type: ignore[operator]
    assert n >= 4


async def test_a_bad_record_on_a_fence_or_the_marker_lane_leaves_the_lane_working(
    server: EmbeddedServer, creds: Credentials, admin: EventLog, raw_as: object, tmp_path: object
) -> None:
    await admin.dispatch("r-fence", {}, instance="collector-0")
    nc = await raw_as(server, creds, "collector")  # type: ignore[operator]
    await nc.jetstream().publish(admin.subjects.fence("r-fence"), b"not a frame")
    state = await admin.fence_state("r-fence")
    assert state is not None and state.open and state.attempt == 1  # the last good record, the real seq
    assert await admin.supersede("r-fence", 1, instance="coordinator") == 2
    retired = await admin.retire("r-fence", instance="collector-0", reason="test")
    assert retired.retired
    coord = await raw_as(server, creds, "admin")  # type: ignore[operator]
    await coord.jetstream().publish(admin.subjects.mark(), b"garbage on the coordinator's lane")
    with Ledger(tmp_path / "ledger") as led, LocalTokenStore(tmp_path / "tokens") as tokens:  # type: ignore[operator]
        res = await Coordinator(admin, led, tokens).checkpoint(deadline_s=5)
        assert led.checkpoint(res.record.checkpoint_id) is not None
