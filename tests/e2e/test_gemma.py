"""A real model under the engine (issue 30): Gemma 3 270M from the package index, checked by digest,
served by llama.cpp's server, called through the model server's custody with the official SDK."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from rollcut.bus import EventLog, ModelCallPrefixCut
from rollcut.gym.model.engine import ENGINE_MODELS, engine_model_file
from rollcut.ledger import Ledger
from rollcut.participants import Coordinator
from rollcut.testing import ServerProcess
from rollcut.tokens import LocalTokenStore, call_store

from ..engine import Engine
from ..helpers import until
from .test_engine import _stream, engine_model_server

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
        model="rollcut-local",
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


async def test_gemma_is_framed_in_its_own_turns_and_its_log_probs_name_its_own_tokens(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess], gemma: Engine
) -> None:
    """The GGUF from the index has no chat template (llama.cpp then falls back to ChatML, whose
    markers Gemma never saw: it answered 'Say hello in French.<|im_'). Served as the registry says,
    a two-turn conversation is Gemma's ``<start_of_turn>`` turns, the row's prompt ids are those,
    and each log-prob names its token with Gemma's own piece."""
    srv = engine_model_server(nats_url, namespace, tmp_path / "tokens", gemma)
    servers.append(srv)
    await log.dispatch("g2", {"task": 2}, instance="collector")
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Say hello in French."},
    ]
    async with httpx.AsyncClient(base_url=gemma.url, timeout=60) as eng:
        prompt = (await eng.post("/apply-template", json={"messages": messages})).json()["prompt"]
        ids = (
            await eng.post("/tokenize", json={"content": prompt, "add_special": True, "parse_special": True})
        ).json()["tokens"]
    # Gemma's format (its model card): each turn "<start_of_turn>{user|model}\n...<end_of_turn>\n",
    # the answer opened as a model turn
    assert prompt == (
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
        "<start_of_turn>user\nSay hello in French.<end_of_turn>\n<start_of_turn>model\n"
    )
    got = await _client(srv, "g2").chat.completions.create(
        model="rollcut-local",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=16,
        temperature=0,
        logprobs=True,
        logit_bias={str(238 + b): -100 for b in range(0x80, 0x100)},  # whole characters (see above)
    )
    msg = got.choices[0].message
    assert msg.prompt_token_ids == ids  # type: ignore[attr-defined]
    assert "<|im_" not in (msg.content or "") and "<start_of_turn>" not in (msg.content or "")
    assert got.choices[0].logprobs is not None
    entries = got.choices[0].logprobs.content or []
    assert len(entries) == len(msg.generation_token_ids) > 0  # type: ignore[attr-defined]
    assert [e.logprob for e in entries] == msg.generation_log_probs  # type: ignore[attr-defined]
    # Gemma's pieces (SentencePiece: a word with its leading space), joined, are the answer
    assert "".join(e.token for e in entries) == msg.content


# --- structured outputs and tool calls on a base model (constrained decoding) -------------------


class Note(BaseModel):
    """What the structured-output tests ask the model for: every field bounded, so a small model
    cannot run past its budget inside a value."""

    title: str = Field(max_length=16)
    mood: Literal["good", "bad"]
    done: bool


class Add(BaseModel):
    """A tool's arguments."""

    n: Literal[1, 2, 3]


def _client(srv: ServerProcess, rollout: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{srv.url}/v1",
        api_key="unused",
        max_retries=0,
        default_headers={"x-rollout-id": rollout, "x-rollout-attempt": "1"},
    )


async def test_structured_outputs_and_tool_calls_on_gemma_parse_with_the_official_sdk(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess], gemma: Engine
) -> None:
    """A base model held to a schema by constrained decoding: ``chat.completions.parse`` and
    ``responses.parse`` give pydantic objects, ``tool_choice`` gives tool calls whose arguments parse
    as the tool's model, and the generated ids are the text the client got."""
    srv = engine_model_server(nats_url, namespace, tmp_path / "tokens", gemma)
    servers.append(srv)
    for r in ("s1", "s2", "s3"):
        await log.dispatch(r, {"task": r}, instance="collector")
    say = [{"role": "user", "content": "Write a short note about the weather."}]
    # no byte token is banned here: a constrained output is ASCII JSON, so none is ever sampled
    common: dict[str, Any] = {"model": "rollcut-local", "temperature": 0}

    chat = await _client(srv, "s1").chat.completions.parse(
        messages=say,  # type: ignore[arg-type]
        response_format=Note,
        max_tokens=64,
        **common,
    )
    note = chat.choices[0].message.parsed
    assert isinstance(note, Note) and chat.choices[0].finish_reason == "stop"

    resp = await _client(srv, "s2").responses.parse(
        input="Write a short note about the sea.",
        text_format=Note,
        max_output_tokens=64,
        model="rollcut-local",
        temperature=0,
    )
    assert isinstance(resp.output_parsed, Note)

    tool = await _client(srv, "s3").chat.completions.parse(
        messages=[{"role": "user", "content": "Add one to the counter."}],
        tools=[
            openai.pydantic_function_tool(Add, name="add"),
            openai.pydantic_function_tool(Note, name="note"),
        ],
        tool_choice={"type": "function", "function": {"name": "add"}},
        max_tokens=32,
        **common,
    )
    msg = tool.choices[0].message
    assert tool.choices[0].finish_reason == "tool_calls" and msg.content is None
    assert msg.tool_calls is not None and len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call.type == "function" and call.function.name == "add"
    assert isinstance(call.function.parsed_arguments, Add)
    # the token data is the engine's: its ids are the call's JSON, then the end token the grammar
    # left as the only choice once the value was whole
    raw = tool.model_dump()["choices"][0]["message"]
    *value, end = raw["generation_token_ids"]
    async with httpx.AsyncClient(base_url=gemma.url, timeout=60) as eng:
        said = (await eng.post("/detokenize", json={"tokens": value})).json()["content"]
        ended = (await eng.post("/detokenize", json={"tokens": [end]})).json()["content"]
    assert json.loads(said) == {"name": "add", "arguments": json.loads(call.function.arguments)}
    assert ended in ("<eos>", "<end_of_turn>")


class Story(BaseModel):
    """Long enough to be cut mid-generation, bounded so it ends."""

    title: str = Field(max_length=24)
    lines: list[Literal["rain", "sun", "wind", "snow"]] = Field(min_length=40, max_length=40)


async def test_a_constrained_generation_cut_mid_flight_continues_under_the_rest_of_its_schema_after_sigkill(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess], gemma: Engine
) -> None:
    """The grammar a continuation runs under is the rest of the schema after the durable prefix: the
    continued call's text is one valid value whose start is the prefix, and the engine generated only
    the rest."""
    tokens_dir = tmp_path / "tokens"
    srv = engine_model_server(nats_url, namespace, tokens_dir, gemma)
    servers.append(srv)
    await log.dispatch("k1", {"task": 1}, instance="collector")
    schema = Story.model_json_schema()
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Forty words of weather, as JSON."}],
        "max_tokens": 400,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "Story", "schema": schema}},
    }
    headers = {"x-rollout-id": "k1", "x-rollout-attempt": "1"}
    with Ledger(tmp_path / "ledger") as led, LocalTokenStore(tokens_dir) as tokens:
        coord = Coordinator(log, led, tokens)
        seen: list[str] = []
        async with httpx.AsyncClient(base_url=srv.url, timeout=120) as client:
            call = asyncio.ensure_future(_stream(client, body, headers, seen))
            await until(lambda: len(seen) >= 12, timeout=60, what="12 tokens of the value streamed")
            res = await coord.checkpoint(deadline_s=10, expect=set(srv.instances))
            srv.kill()
            with contextlib.suppress(httpx.HTTPError):
                await call
        cuts = [
            s.event
            async for s in log.read(rollout_id="k1", up_to=res.record.cut)
            if isinstance(s.event, ModelCallPrefixCut)
        ]
        assert len(cuts) == 1
        k = cuts[0].token_boundary
        prefix = await call_store(tokens, tokens.get, cuts[0].receipt)
        await until(gemma.idle, timeout=30, what="the engine stopped the dead server's request")
        restarted = engine_model_server(nats_url, namespace, tokens_dir, gemma)
        servers.append(restarted)
        await log.supersede(
            "k1", 1, instance="coordinator", checkpoint_id=res.record.checkpoint_id, from_cut=res.record.cut
        )
        before = gemma.tokens_predicted()
        async with httpx.AsyncClient(base_url=restarted.url, timeout=300) as client:
            out = (
                await client.post(
                    "/v1/chat/completions", json=body, headers={**headers, "x-rollout-attempt": "2"}
                )
            ).json()
        generated = gemma.tokens_predicted() - before
    msg = out["choices"][0]["message"]
    assert out["rollcut"]["continued_from"] == k > 0
    assert msg["generation_token_ids"][:k] == prefix.output_ids
    assert msg["generation_log_probs"][:k] == prefix.logprobs
    assert generated == len(msg["generation_token_ids"]) - k  # the engine generated only the rest
    story = Story.model_validate_json(msg["content"])  # one whole value under the schema
    async with httpx.AsyncClient(base_url=gemma.url, timeout=60) as eng:
        kept = (await eng.post("/detokenize", json={"tokens": prefix.output_ids})).json()["content"]
    assert msg["content"].startswith(kept) and len(story.lines) == 40


def _run_whole(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a command in a session of its own; past ``timeout`` every process it started (the demo's
    servers, its engine) is SIGKILLed with it, so a test that times out leaves nothing behind."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


_DEMO = [sys.executable, "-m", "rollcut", "demo", "--engine", "llama.cpp", "--model", "gemma-3-270m"]


@pytest.mark.timeout(1500)  # a real model on two shared cores: minutes, three recoveries after the crash
def test_the_demo_on_gemma_runs_tool_episodes_through_the_crash_and_names_its_baseline(
    tmp_path: Path,
) -> None:
    """``rollcut demo --engine llama.cpp --model gemma-3-270m``: counter, blackjack and workplace
    episodes of tool calls on the real model, every Gym process SIGKILLed mid-run, every row once,
    nothing completed generated again by rollcut while restarting from input regenerates, and the
    last-checkpoint way's interval named."""
    home = tmp_path / "demo"
    done = _run_whole([*_DEMO, "--rollouts", "3", "--home", str(home), "--json"], timeout=1400)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["results_written"] == 3 and out["duplicate_results"] == 0 and out["crashes"] == 1
    assert out["recovery"]["continue"] >= 1  # mid-episode at the crash, continued from its cut
    rows = [json.loads(line) for line in (home / "rollouts.jsonl").read_text().splitlines()]
    assert len({r["rollout_id"] for r in rows}) == 3 == len(rows)
    assert {r["env"] for r in rows} == {"counter", "blackjack", "workplace"}
    # the tool calls were the model's, generated under the constraint and executed
    calls = [i for r in rows for i in r["response"]["output"] if i.get("type") == "function_call"]
    assert calls and all(json.loads(c["arguments"]) is not None for c in calls)
    assert out["tool_calls"]["executed"] > 0
    rollcut, restart = out["compared"]["rollcut"], out["compared"]["restart"]
    assert rollcut["model_calls_regenerated"] == 0 and rollcut["tokens_regenerated"] == 0
    assert restart["tokens_regenerated"] > 0
    assert out["engine"]["dialect"] == "llama.cpp" and out["engine"]["cuts"] is True
    # which model made the rows, by the name it was asked for
    assert out["model"]["backend"] == "engine" and out["model"]["engine"] == "llama.cpp"
    assert out["model"]["name"] == "gemma-3-270m"
    base = out["baseline"]
    assert base == out["compared"]["last_checkpoint"]["baseline"] and base["every_s"] >= 4.0 and base["why"]
