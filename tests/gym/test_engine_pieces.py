"""Each token's text for log-probs, from the engine's own detokenizer (``engine/_pieces``): a token
that ends mid-character is its byte, written as OpenAI writes it (``\\xNN``), never a guess."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ..engine import Engine


@pytest.fixture
def bytes_engine(tmp_path: Path) -> Iterator[Engine]:
    """The tiny model with its byte tokens (not whole UTF-8 characters alone) in its vocabulary."""
    eng = Engine(tmp_path, ascii_only=False).start()
    try:
        yield eng
    finally:
        eng.kill()


async def test_byte_tokens_are_their_bytes_and_a_character_they_do_not_complete_is_not_guessed(
    bytes_engine: Engine,
) -> None:
    async with httpx.AsyncClient(base_url=bytes_engine.url) as eng:
        ids = (await eng.post("/tokenize", json={"content": "é the"})).json()["tokens"]
        # the engine's own split: 'é' is two byte tokens, neither a character alone
        alone = [(await eng.post("/detokenize", json={"tokens": [i]})).json()["content"] for i in ids[:2]]
    assert all("\ufffd" in a for a in alone), alone
    fresh = bytes_engine.backend()
    # one byte token alone, its character never completed: its text as the engine wrote it, no bytes
    [lone] = await fresh.token_texts(ids[:1])
    assert lone.bytes is None and lone.token == alone[0]
    texts = await bytes_engine.backend().token_texts(ids)
    assert [t.bytes for t in texts[:2]] == [[0xC3], [0xA9]]
    assert [t.token for t in texts[:2]] == ["\\xc3", "\\xa9"]  # OpenAI's way of writing them
    joined = b"".join(bytes(t.bytes or []) for t in texts)
    assert joined.decode("utf-8") == "é the" and "".join(t.token for t in texts[2:]) == " the"
