"""The one oracle every collection's rows are held to fails what it must: a row twice, a row missing."""

from __future__ import annotations

import pytest

from .helpers import each_rollout_once


def test_each_rollout_once_passes_one_row_each_and_fails_a_row_twice_or_a_rollout_without_one() -> None:
    a, b = {"rollout_id": "a"}, {"rollout_id": "b"}
    each_rollout_once([a, b], 2)
    each_rollout_once([b, a], ["a", "b"])
    with pytest.raises(AssertionError, match=r"twice: \['a'\]"):
        each_rollout_once([a, a, b], 2)
    with pytest.raises(AssertionError, match="1 of 2 rollouts"):
        each_rollout_once([a], 2)
    with pytest.raises(AssertionError, match=r"missing \['b'\]"):
        each_rollout_once([a], ["a", "b"])
