"""The token-store contract: every implementation runs this same suite, rollcut's and a plugin's.

Subclass :class:`TokenStoreContract` in a test module (its name starting ``Test``, so pytest
collects it) and implement ``make_store``; the tests are the contract (eventsourcing's
recorder-test-case pattern). Needs pytest (``rollcut.testing`` loads this module only when the
name is asked for, so the harness does not).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .._errors import TokenStoreError
from ..bus import TokenReceipt
from ..tokens import LineageStore, TokenRecord, TokenSink, TokenSource

__all__ = ["TokenStoreContract", "sample_record"]


def sample_record(n: int) -> TokenRecord:
    """A record whose prompt is ``n`` tokens long (distinct per ``n``), for a store's tests."""
    return TokenRecord(
        prompt_ids=list(range(n)),
        output_ids=[n, n + 1, n + 2],
        mask=[1, 1, 1],
        logprobs=[-0.5, -0.25, -0.125],
        policy_version="v7",
    )


class TokenStoreContract:
    """What every token store must do: a test case class to subclass, with ``make_store``."""

    def make_store(self, tmp_path: Path) -> Any:
        """The store under test, opened in ``tmp_path`` (closed by the fixture)."""
        raise NotImplementedError

    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[Any]:
        s = self.make_store(tmp_path)
        yield s
        s.close()

    def test_implements_the_three_protocols(self, store: Any) -> None:
        assert isinstance(store, TokenSink)
        assert isinstance(store, TokenSource)
        assert isinstance(store, LineageStore)

    def test_put_then_get_returns_the_same_tokens(self, store: Any) -> None:
        r = store.put("c1", sample_record(4))
        assert r.count == 3 and store.has(r)
        assert store.get(r) == sample_record(4)

    def test_put_is_idempotent(self, store: Any) -> None:
        assert store.put("c1", sample_record(4)) == store.put("c1", sample_record(4))
        s1 = store.snapshot("a")
        store.put("c1", sample_record(4))
        assert store.snapshot("b").count == s1.count

    def test_a_receipt_with_a_wrong_digest_is_refused(self, store: Any) -> None:
        r = store.put("c1", sample_record(4))
        forged = TokenReceipt(receipt_id=r.receipt_id, count=r.count, digest="0" * 32)
        assert not store.has(forged)
        with pytest.raises(TokenStoreError):
            store.get(forged)

    def test_lineage_chains_from_root(self, store: Any) -> None:
        for cid, parent in (("c1", None), ("c2", "c1"), ("c3", "c2")):
            store.link(cid, parent, store.put(cid, sample_record(len(cid))).receipt_id)
        assert store.chain("c3") == ["c1", "c2", "c3"]

    def test_snapshot_binds_exactly_what_was_there(self, store: Any) -> None:
        before = store.put("c1", sample_record(1))
        snap = store.snapshot("ck1")
        after = store.put("c2", sample_record(2))
        assert store.in_snapshot(snap, before) and not store.in_snapshot(snap, after)
        assert store.snapshot("ck1") == snap  # idempotent per checkpoint id
        assert store.verify_snapshot(snap) == []
        later = store.snapshot("ck2")
        assert later.digest != snap.digest and store.verify_snapshot(later) == []

    def test_a_bound_snapshot_is_found_as_bound_and_an_unknown_one_is_not(self, store: Any) -> None:
        store.put("c1", sample_record(1))
        snap = store.snapshot("ck1")
        store.put("c2", sample_record(2))
        assert store.find_snapshot(snap.snapshot_id) == snap  # as bound, not as the store is now
        assert store.find_snapshot("snap-never-bound") is None
