"""The vLLM dialect against the shapes vLLM answers in, built with OpenAI's own types.

No vLLM runs on these machines (it needs a GPU or a long CPU build); llama.cpp's dialect runs
against the real server in ``test_engine.py``. vLLM's ``/v1/completions`` stream chunks are
OpenAI ``Completion`` objects (``text_completion``) whose log-prob tokens are ``"token_id:N"``
strings when ``return_tokens_as_token_ids`` is on, with usage in a last chunk without choices
when ``stream_options.include_usage`` is; these are built here with the ``openai`` SDK's types.
"""

from __future__ import annotations

import typing

import pytest
from openai.types import Completion, CompletionUsage
from openai.types.completion_choice import CompletionChoice, Logprobs
from openai.types.completion_create_params import CompletionCreateParamsStreaming

from rollcut.gym.model.engine import VLLM, EngineBackend, EngineError, Piece


def chunk(ids: list[int], lps: list[float], text: str, finish: str | None = None) -> dict[str, typing.Any]:
    choice = CompletionChoice.model_construct(
        index=0,
        text=text,
        logprobs=Logprobs(
            tokens=[f"token_id:{i}" for i in ids], token_logprobs=lps, text_offset=[0] * len(ids)
        ),
        finish_reason=finish,  # type: ignore[arg-type]  # None while streaming, as vLLM sends it
    )
    body = Completion.model_construct(
        id="cmpl-1", object="text_completion", created=1, model="m", choices=[choice], usage=None
    )
    return body.model_dump(mode="json")


def usage(n: int) -> dict[str, typing.Any]:
    body = Completion.model_construct(
        id="cmpl-1",
        object="text_completion",
        created=1,
        model="m",
        choices=[],
        usage=CompletionUsage(prompt_tokens=5, completion_tokens=n, total_tokens=5 + n),
    )
    return body.model_dump(mode="json")


def test_a_vllm_stream_gives_every_id_its_log_prob_the_finish_and_the_engine_count() -> None:
    d = VLLM("m")
    first = d.parse(chunk([11, 12], [-0.5, -1.5], "ab"))
    assert (first.ids, first.logprobs, first.text, first.finish_reason) == (
        [11, 12],
        [-0.5, -1.5],
        "ab",
        None,
    )
    last = d.parse(chunk([13], [-0.25], "c", finish="length"))
    assert (last.ids, last.finish_reason) == ([13], "length")
    assert d.parse(usage(3)).engine_count == 3


def test_a_vllm_count_that_disagrees_with_the_streamed_ids_is_refused() -> None:
    backend = EngineBackend(None, VLLM("m"))  # type: ignore[arg-type]  # only the check runs
    backend._check(Piece(engine_count=3), received=3)
    with pytest.raises(EngineError, match="dropped their ids"):
        backend._check(Piece(engine_count=4), received=3)


def test_a_vllm_server_without_token_ids_is_named_not_guessed() -> None:
    body = chunk([1], [-1.0], "x")
    body["choices"][0]["logprobs"]["tokens"] = ["x"]
    with pytest.raises(EngineError, match="--return-tokens-as-token-ids"):
        VLLM("m").parse(body)


def test_a_vllm_request_is_a_streamed_completion_with_a_token_prompt_and_the_rest_of_the_budget() -> None:
    path, req = VLLM("m").request(
        [1, 2, 3, 40, 41], 60, {"temperature": 0.7, "seed": 5, "logit_bias": {"9": -100}}
    )
    assert path == "/v1/completions"
    known = set(typing.get_type_hints(CompletionCreateParamsStreaming)) | {"return_tokens_as_token_ids"}
    assert set(req) <= known  # OpenAI's parameters, and vLLM's one extension
    assert req["prompt"] == [1, 2, 3, 40, 41] and req["max_tokens"] == 60 and req["stream"] is True
    assert req["return_tokens_as_token_ids"] is True and req["logprobs"] == 1
    assert (req["temperature"], req["seed"], req["logit_bias"]) == (0.7, 5, {"9": -100})
