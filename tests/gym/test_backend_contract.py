"""The backends that cut pass the backend contract (``rollcut.testing``): a cut at several points,
continued, is the uninterrupted call, on the local backend and on a real engine (llama.cpp's
server on the tiny model, greedy)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollcut.gym.model import Backend, LocalBackend
from rollcut.testing import BackendContract

from ..engine import Engine


class TestLocalBackend(BackendContract):
    def make_backend(self) -> Backend:
        return LocalBackend(seed=11)


class TestEngineBackend(BackendContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[Backend]:
        eng = Engine(tmp_path).start()
        try:
            yield eng.backend()
        finally:
            eng.kill()
