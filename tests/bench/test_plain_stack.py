"""The plain stack (``bench e2e --way plain``): the demo's servers without custody, collected by a loop
that posts ``/run``. What it is compared with only means something if it does the same work: every
rollout, the same rows, the same token arrays; and a rollout that fails stops it, never a ratio
computed over part of the work."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollcut.bench._plain_stack import PlainCollectionError, collect_plain, plain_server
from rollcut.collect import Rows
from rollcut.demo import demo_rows
from rollcut.testing import ServerProcess, start_stack


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    """One plain stack for the module (starting one is most of each test's time)."""
    where = tmp_path_factory.mktemp("plain")
    stack = start_stack(
        "",
        None,
        where / "tokens",
        namespace="plain",
        launcher=plain_server,
        environment=False,
        logs=where / "logs",
    )
    try:
        yield stack
    finally:
        for p in stack:
            p.close()


async def test_the_plain_stack_collects_every_rollout_of_the_demo_rows_with_its_token_arrays(
    plain: list[ServerProcess], tmp_path: Path
) -> None:
    tasks = demo_rows(6, seed=3)
    out = tmp_path / "rows" / "rollouts.jsonl"
    run = await collect_plain(plain[-1].url, tasks, concurrency=3, output=out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    expected = Rows(tasks, 1, tmp_path / "ids.jsonl")
    try:
        ids = sorted(expected.inputs)
    finally:
        expected.close()
    # the same rollouts as rollcut's collection would name them, each written once
    assert run.written == 6 and sorted(r["rollout_id"] for r in rows) == ids
    assert run.collect_s > 0 and run.rows_per_s == pytest.approx(6 / run.collect_s)
    for row in rows:
        assert isinstance(row["reward"], float) and row["attempt"] == 1
        calls = [o for o in row["response"]["output"] if o["type"] == "function_call"]
        # the training arrays come from the generation itself (no token store): present and aligned
        assert calls and all(
            len(c["generation_token_ids"]) == len(c["generation_log_probs"]) > 0 and c["prompt_token_ids"]
            for c in calls
        ), row
    assert all(p.alive() for p in plain)


async def test_a_rollout_the_plain_stack_refuses_stops_its_collection_naming_it(
    plain: list[ServerProcess], tmp_path: Path
) -> None:
    tasks = demo_rows(3, seed=0)
    tasks[1] = {**tasks[1], "env": "no-such-env"}  # the agent has no resources server for it
    with pytest.raises(PlainCollectionError) as err:
        await collect_plain(plain[-1].url, tasks, concurrency=1, output=tmp_path / "rows" / "r.jsonl")
    assert err.value.rollout_id == "1-0" and 400 <= err.value.status < 500, str(err.value)
