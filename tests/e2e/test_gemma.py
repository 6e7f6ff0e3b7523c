"""A real model under the engine (issue 30): Gemma 3 270M from the package index, checked by digest,
served by llama.cpp's server, called through the model server's custody with the official SDK."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from rollcut.bus import EventLog
from rollcut.gym.model.engine import ENGINE_MODELS, engine_model_file
from rollcut.testing import ServerProcess

from ..engine import Engine
from .test_engine import engine_model_server

pytestmark = pytest.mark.slow

GEMMA = ENGINE_MODELS["gemma-3-270m"]


def _sha256(path: Path) -> str:
    """Computed here, not by rollcut's own check."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@pytest.fixture
def gemma(tmp_path: Path) -> Iterator[Engine]:
    eng = Engine(tmp_path, named="gemma-3-270m", slots=2).start()
    try:
        yield eng
    finally:
        eng.kill()


def test_the_named_model_is_assembled_once_its_digest_checked_and_a_changed_file_refused(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rollcut", "engine", "model", "gemma-3-270m", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    path = Path(out["path"])
    assert out["sha256"] == GEMMA.sha256 == _sha256(path)
    assert (path.parent / "GEMMA_TERMS.html").is_file() and "Gemma" in out["terms"]
    assert engine_model_file("gemma-3-270m") == path  # the cached file, the same bytes
    # a cache whose file was changed on disk is refused, not served
    cache = tmp_path / "cache"
    (cache / "rollcut" / "models").mkdir(parents=True)
    bad = cache / "rollcut" / "models" / path.name
    shutil.copyfile(path, bad)
    with bad.open("r+b") as f:
        f.seek(1 << 20)
        byte = f.read(1)
        f.seek(1 << 20)
        f.write(bytes([byte[0] ^ 0xFF]))
    refused = subprocess.run(
        [sys.executable, "-m", "rollcut", "engine", "model", "gemma-3-270m"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "ROLLCUT_CACHE": str(cache)},
    )
    assert refused.returncode == 2, refused.stderr
    assert "changed on disk" in refused.stderr and "Traceback" not in refused.stderr


async def test_a_call_on_gemma_keeps_the_engines_own_tokens_byte_fallback_included(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess], gemma: Engine
) -> None:
    """Through the model server with the official SDK: the row's prompt ids are the engine's own
    tokenization of the chat template (SentencePiece, byte-fallback tokens for what the vocabulary
    lacks), and the generated ids detokenize to the content the client got."""
    srv = engine_model_server(nats_url, namespace, tmp_path / "tokens", gemma)
    servers.append(srv)
    await log.dispatch("g1", {"task": 1}, instance="collector")
    messages = [{"role": "user", "content": "Count to three: one, two \U0002070e \u0b9a"}]
    client = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)
    got = await client.chat.completions.create(
        model="policy",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
        # llama.cpp streams a token that ends mid-character merged into the next chunk, its id dropped
        # (rollcut refuses such a call, 502: docs/engines.md); on Gemma those are the byte-fallback
        # tokens of bytes 0x80-0xFF (ids 366-493), so the generation is kept to whole characters
        logit_bias={str(238 + b): -100 for b in range(0x80, 0x100)},
        extra_headers={"x-rollout-id": "g1", "x-rollout-attempt": "1"},
    )
    msg = got.choices[0].message.model_dump()
    async with httpx.AsyncClient(base_url=gemma.url, timeout=60) as eng:
        prompt = (await eng.post("/apply-template", json={"messages": messages})).json()["prompt"]
        ids = (
            await eng.post("/tokenize", json={"content": prompt, "add_special": True, "parse_special": True})
        ).json()["tokens"]
        pieces = (await eng.post("/tokenize", json={"content": "\U0002070e", "with_pieces": True})).json()[
            "tokens"
        ]
        said = (await eng.post("/detokenize", json={"tokens": msg["generation_token_ids"]})).json()["content"]
        eos = (await eng.post("/tokenize", json={"content": "<eos>", "parse_special": True})).json()["tokens"]
    assert eos == [GEMMA.eos_id]  # the end token the registry names is the model's
    assert msg["prompt_token_ids"] == ids and len(ids) > 10
    # a rare CJK character is byte-fallback tokens, one per UTF-8 byte: id 238 + the byte
    assert all(isinstance(p["piece"], list) for p in pieces)
    assert [p["id"] for p in pieces] == [238 + b for b in "\U0002070e".encode()]
    assert 0 < len(msg["generation_token_ids"]) <= 12 and msg["content"] == said
    assert len(msg["generation_log_probs"]) == len(msg["generation_token_ids"])
