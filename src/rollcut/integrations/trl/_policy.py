"""One policy, two files: the trainer's Hugging Face model and the engine's GGUF, same weights.

Why rollcut writes both: the data a trainer takes from rollcut must be the data the policy it
trains produced, token for token and log-prob for log-prob. That is checkable only when the
engine that generated and the trainer that recomputes hold the same weights, so the policy is
born here as seeded weights in GGUF layout (the tiny model the engine suite already uses: a
llama block, byte-level BPE, with the non-ASCII byte tokens made unsampleable by the output
layer), loaded into ``transformers``' ``LlamaForCausalLM``, and written back to GGUF after
every optimizer step for the engine to serve as the next policy version.

The one non-trivial fact of the conversion: llama.cpp's llama architecture applies rotary
embeddings to adjacent pairs of a head's dimensions, Hugging Face's to its two halves, so the
query and key projections are stored with each head's rows reordered (pairs interleaved)
in the GGUF. :func:`to_gguf_layout` and :func:`from_gguf_layout` are that reordering and its
inverse; a round trip is the identity (tested), and the log-probs the engine reports for the
GGUF agree with the ones torch computes for the model (tested, the bound in
``docs/trainer-integration.md``).

Everything is float32: a quantized GGUF would make the agreement a matter of tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ..._files import file_sha256
from ...gym.model.engine import LlamaShape, Vocabulary, tiny_vocabulary, tiny_weights, write_llama_gguf

if TYPE_CHECKING:
    import numpy as np
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

__all__ = [
    "POLICY_SHAPE",
    "PolicyFiles",
    "PolicyManifest",
    "from_gguf_layout",
    "load_policy",
    "new_policy",
    "policy_files",
    "to_gguf_layout",
    "write_policy",
]

POLICY_SHAPE = LlamaShape(n_embd=128, n_layer=2, n_head=2, n_ff=384, ctx=2048)
"""Small enough that a CPU trains it in seconds a step, large enough to be a transformer."""

_HF = {  # GGUF tensor name (per block) -> Hugging Face's
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


class PolicyManifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``rollcut-policy.json`` in a version's Hugging Face directory: which engine file it is."""

    version: int
    gguf_sha256: str
    schema: int = 1


@dataclass(frozen=True)
class PolicyFiles:
    """A policy version on disk: the trainer's directory and the engine's file, one digest."""

    version: int
    hf_dir: Path
    gguf: Path
    digest: str  # sha256 of the GGUF: what the engine serves, named by the rows' versions


def to_gguf_layout(w: np.ndarray, n_head: int) -> np.ndarray:
    """A query/key projection from Hugging Face's rotary layout to llama.cpp's."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def from_gguf_layout(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of :func:`to_gguf_layout`."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _config(vocab: Vocabulary, shape: LlamaShape) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(vocab.tokens),
        hidden_size=shape.n_embd,
        intermediate_size=shape.n_ff,
        num_hidden_layers=shape.n_layer,
        num_attention_heads=shape.n_head,
        num_key_value_heads=shape.n_head,
        max_position_embeddings=shape.ctx,
        rms_norm_eps=shape.rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_base},
        hidden_act="silu",
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=vocab.bos_id,
        eos_token_id=vocab.eos_id,
        pad_token_id=vocab.eos_id,
        dtype="float32",
    )


def _tokenizer(vocab: Vocabulary) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from ...gym.model.engine import TINY_CHAT_TEMPLATE

    ids = {t: i for i, t in enumerate(vocab.tokens)}
    merges = [(a, b) for a, _, b in (m.partition(" ") for m in vocab.merges)]
    tok = Tokenizer(models.BPE(vocab=ids, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def _pairs(shape: LlamaShape) -> list[tuple[str, str, bool]]:
    """Every tensor as (GGUF name, Hugging Face name, whether its rows are in rotary layout)."""
    pairs = [
        ("token_embd.weight", "model.embed_tokens.weight", False),
        ("output_norm.weight", "model.norm.weight", False),
        ("output.weight", "lm_head.weight", False),
    ]
    for i in range(shape.n_layer):
        for g, h in _HF.items():
            pairs.append((f"blk.{i}.{g}.weight", f"model.layers.{i}.{h}.weight", g in ("attn_q", "attn_k")))
    return pairs


def _hf_state(tensors: dict[str, Any], shape: LlamaShape) -> dict[str, torch.Tensor]:
    import torch

    return {
        h: torch.from_numpy((from_gguf_layout(tensors[g], shape.n_head) if rotary else tensors[g]).copy())
        for g, h, rotary in _pairs(shape)
    }


def _gguf_tensors(model: LlamaForCausalLM, shape: LlamaShape) -> dict[str, Any]:
    import numpy as np
    import torch

    state = {k: v.detach().to("cpu").to(torch.float32).numpy() for k, v in model.state_dict().items()}
    return {
        g: np.ascontiguousarray(
            to_gguf_layout(state[h], shape.n_head) if rotary else state[h], dtype=np.float32
        )
        for g, h, rotary in _pairs(shape)
    }


def new_policy(
    *, seed: int = 0, shape: LlamaShape = POLICY_SHAPE
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """The seeded initial policy as a ``transformers`` model and its tokenizer."""
    from transformers import LlamaForCausalLM

    vocab = tiny_vocabulary()
    tensors = tiny_weights(shape, len(vocab.tokens), seed=seed, banned=[*range(0x80, 0x100), vocab.bos_id])
    model = LlamaForCausalLM(_config(vocab, shape))
    model.load_state_dict(_hf_state(tensors, shape), strict=True)
    model.eval()
    return model, _tokenizer(vocab)


def write_policy(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, where: Path, version: int
) -> PolicyFiles:
    """Write ``model`` as policy ``version`` under ``where``: ``v<version>/`` (Hugging Face) and
    ``v<version>.gguf`` (the engine's), both written to a temporary name and renamed into place."""
    shape = _shape_of(model)
    hf_dir = where / f"v{version}"
    model.save_pretrained(hf_dir, safe_serialization=True)
    tokenizer.save_pretrained(hf_dir)
    gguf = where / f"v{version}.gguf"
    tmp = gguf.with_suffix(".gguf.part")
    write_llama_gguf(
        tmp, tiny_vocabulary(), shape, _gguf_tensors(model, shape), name=f"rollcut-policy-v{version}"
    )
    tmp.replace(gguf)
    digest = file_sha256(gguf)
    (hf_dir / "rollcut-policy.json").write_bytes(msgspec.json.encode(PolicyManifest(version, digest)))
    return PolicyFiles(version, hf_dir, gguf, digest)


def policy_files(where: Path, version: int) -> PolicyFiles:
    """Policy ``version`` as :func:`write_policy` left it under ``where`` (its manifest's digest)."""
    hf_dir = where / f"v{version}"
    manifest = msgspec.json.decode((hf_dir / "rollcut-policy.json").read_bytes(), type=PolicyManifest)
    return PolicyFiles(version, hf_dir, where / f"v{version}.gguf", manifest.gguf_sha256)


def load_policy(files: PolicyFiles) -> tuple[Any, Any]:
    """Policy ``files.version`` as the trainer wrote it."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    model: Any = LlamaForCausalLM.from_pretrained(files.hf_dir, dtype="float32")
    model.eval()
    return model, AutoTokenizer.from_pretrained(files.hf_dir)


def _shape_of(model: LlamaForCausalLM) -> LlamaShape:
    c = model.config
    return LlamaShape(
        n_embd=c.hidden_size,
        n_layer=c.num_hidden_layers,
        n_head=c.num_attention_heads,
        n_ff=c.intermediate_size,
        ctx=c.max_position_embeddings,
        rms_eps=c.rms_norm_eps,
        rope_base=POLICY_SHAPE.rope_base,
    )
