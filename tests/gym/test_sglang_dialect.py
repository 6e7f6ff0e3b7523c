"""The SGLang dialect against the shapes SGLang's runtime answers in, as its public source defines them
(``io_struct.py`` ``GenerateReqInput``; the tokenizer manager's output processor; ``protocol.py``
``TokenizeRequest``). No SGLang runs here (it needs a GPU); the engine suite runs against a real one
through ``ROLLCUT_ENGINE_DIALECT=sglang`` (tests/engine.py) on a machine that has one.

The bodies below are what that source builds: ``{"text", "output_ids", "meta_info"}`` per ``data:``
line, cumulative by default (every id and ``[logprob, token_id, text]`` so far), only the new ones
under ``--incremental-streaming-output``; ``finish_reason`` None until ``{"type": ...}``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from rollcut.gym.model.engine import DIALECTS, EngineError, SGLang

# GenerateReqInput's fields the dialect may send (io_struct.py, read 2026-12-03)
GENERATE_FIELDS = {
    "rid", "text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len",
    "top_logprobs_num", "stream", "return_text_in_logprobs",
}  # fmt: skip
# SamplingParams' names (sampling/sampling_params.py, and the /generate docs' table)
SAMPLING_FIELDS = {
    "max_new_tokens", "temperature", "top_p", "stop", "sampling_seed", "presence_penalty",
    "frequency_penalty", "logit_bias", "ebnf",
}  # fmt: skip


def out(
    rid: str, ids: list[int], lps: list[float], text: str | None, count: int, finish: Any = None
) -> dict[str, Any]:
    entries = [[lp, i, None] for lp, i in zip(lps, ids, strict=True)]
    meta = {"id": rid, "finish_reason": finish, "prompt_tokens": 5, "completion_tokens": count,
            "cached_tokens": 0, "output_token_logprobs": entries}  # fmt: skip
    return {"text": text, "output_ids": ids, "meta_info": meta}


def test_a_cumulative_stream_hands_over_each_token_once_with_its_log_prob() -> None:
    d = SGLang()
    first = d.parse(out("r1", [11, 12], [-0.5, -1.5], "ab", 2))
    assert (first.ids, first.logprobs, first.text, first.engine_count) == ([11, 12], [-0.5, -1.5], "ab", 2)
    mid = d.parse(out("r1", [11, 12, 13], [-0.5, -1.5, -0.25], None, 3))  # text left for later
    assert (mid.ids, mid.logprobs, mid.text) == ([13], [-0.25], "")
    last = d.parse(
        out("r1", [11, 12, 13, 14], [-0.5, -1.5, -0.25, -2.0], "abcd", 4, {"type": "length", "length": 4})
    )
    assert (last.ids, last.logprobs, last.text, last.finish_reason) == ([14], [-2.0], "cd", "length")


def test_an_incremental_stream_is_taken_as_it_comes() -> None:
    d = SGLang()
    a = d.parse(out("r2", [7], [-0.1], "x", 1))
    b = d.parse(out("r2", [8, 9], [-0.2, -0.3], "yz", 3, {"type": "stop", "matched": 2}))
    assert (a.ids, b.ids, b.logprobs, b.text, b.finish_reason) == ([7], [8, 9], [-0.2, -0.3], "yz", "stop")


def test_two_requests_streaming_at_once_are_kept_apart_by_their_rid() -> None:
    d = SGLang()
    d.parse(out("a", [1], [-1.0], "p", 1))
    d.parse(out("b", [5, 6], [-1.0, -1.0], "qr", 2))
    assert d.parse(out("a", [1, 2], [-1.0, -2.0], "ps", 2)).ids == [2]
    assert d.parse(out("b", [5, 6, 7], [-1.0, -1.0, -3.0], "qrt", 3)).ids == [7]


@pytest.mark.parametrize(
    "body",
    [
        {"output_ids": [1], "meta_info": {"completion_tokens": 1}},  # no rid
        {"output_ids": [1], "meta_info": {"id": "r"}},  # no count
        out("r", [1], [-1.0], "x", 3),  # counts tokens the chunk does not hold
        {
            "output_ids": [1],
            "meta_info": {"id": "r", "completion_tokens": 1, "output_token_logprobs": [["x", 1]]},
        },
    ],
)
def test_a_chunk_rollcut_cannot_account_for_is_refused(body: dict[str, Any]) -> None:
    with pytest.raises(EngineError):
        SGLang().parse(body)


def test_an_engine_side_abort_is_a_lost_call_not_an_answer() -> None:
    with pytest.raises(EngineError, match="aborted") as lost:
        SGLang().parse(out("r", [1], [-1.0], "x", 1, {"type": "abort", "message": "preempted"}))
    assert lost.value.lost


def test_a_request_is_a_streamed_generate_with_a_token_prompt_and_sglang_s_own_names() -> None:
    path, req = SGLang("m").request(
        [1, 2, 3, 40],
        60,
        {"temperature": 0.7, "seed": 5, "stop": ["\n"], "logit_bias": {"9": -100}},
        grammar='root ::= "a"',
    )
    assert (
        path == "/generate" and set(req) <= GENERATE_FIELDS and set(req["sampling_params"]) <= SAMPLING_FIELDS
    )
    assert req["input_ids"] == [1, 2, 3, 40] and req["stream"] is True and req["return_logprob"] is True
    assert req["logprob_start_len"] == -1 and req["rid"].startswith("rollcut-")
    params = req["sampling_params"]
    assert (params["max_new_tokens"], params["temperature"], params["sampling_seed"]) == (60, 0.7, 5)
    assert (params["stop"], params["logit_bias"], params["ebnf"]) == (["\n"], {"9": -100.0}, 'root ::= "a"')
    assert SGLang().request([1], 1, {})[1]["rid"] != SGLang().request([1], 1, {})[1]["rid"]


async def test_tokenize_applies_the_chat_template_on_the_server_and_detokenize_reads_text() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.path, body))
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": [1, 2, 3], "count": 3, "max_model_len": 4096})
        return httpx.Response(200, json={"text": "hi"})

    d = DIALECTS["sglang"]("qwen")
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://sglang") as c:
        ids = await d.tokenize(
            c, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
        )
        text = await d.detokenize(c, [5, 6])
    assert (ids, text) == ([1, 2, 3], "hi")
    assert seen[0] == ("/tokenize", {"messages": [{"role": "user", "content": "hi"}], "model": "qwen"})
    assert seen[1] == ("/detokenize", {"tokens": [5, 6]})
    assert d.capabilities.can_cut and d.capabilities.counts_tokens and not d.capabilities.slots
