"""A tiny llama-architecture GGUF with random weights and a small real byte-level BPE vocabulary.

Why rollcut writes a model: no model hub is reachable from the machines the suite and the demo
run on, and an engine needs a model file to be an engine. This one is written with the ``gguf``
package in well under a second: random weights (so what it says is noise), but a real
tokenizer (GPT-2 style byte-level BPE with merges, ``<s>``/``</s>``, a chat template), so the
engine tokenizes, templates, samples, streams and reports log-probs exactly as it does for a
real model. Its size is chosen so that one token costs the engine real time on a CPU, which is
what a generation cut needs to land mid-generation.

``ascii_only`` keeps every token a whole UTF-8 character: llama.cpp's server holds back the
ids of tokens that end mid-character when it streams, so a model that can emit them exercises
the backend's refusal to cut at a boundary it did not see (see ``_dialects``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "TINY_CHAT_TEMPLATE",
    "LlamaShape",
    "TinyModel",
    "Vocabulary",
    "tiny_vocabulary",
    "tiny_weights",
    "write_llama_gguf",
    "write_tiny_gguf",
]

_WORDS = ("the", "agent", "tool", "call", "result", "step", "and", "answer", "counter", "value")
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
"""The tiny models' chat template (the engine's GGUF and a trainer's tokenizer share it)."""


@dataclass(frozen=True)
class TinyModel:
    """The shape of the written model (what an engine loads)."""

    path: Path
    n_vocab: int
    bos_id: int
    eos_id: int
    non_ascii_ids: tuple[int, ...]  # byte tokens that are not whole UTF-8 characters


def _byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (the convention byte-level BPE vocabularies use)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = dict(zip(printable, map(chr, printable), strict=True))
    shift = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shift)
            shift += 1
    return chars


@dataclass(frozen=True)
class Vocabulary:
    """The tiny model's tokenizer: GPT-2 style byte-level BPE, ids in list order (the 256 byte
    tokens, the merged words, then ``<s>`` and ``</s>``)."""

    tokens: tuple[str, ...]
    merges: tuple[str, ...]  # "left right", applied in order

    @property
    def bos_id(self) -> int:
        return len(self.tokens) - 2

    @property
    def eos_id(self) -> int:
        return len(self.tokens) - 1


def tiny_vocabulary() -> Vocabulary:
    """The vocabulary every tiny model shares (the engine's GGUF and a trainer's copy of it)."""
    chars = _byte_chars()
    base = [chars[b] for b in range(256)]
    merges: list[str] = []
    extra: list[str] = []
    for word in _WORDS:  # merged left to right: t+h, th+e
        cur = word[0]
        for ch in word[1:]:
            merges.append(f"{cur} {ch}")
            cur += ch
            if cur not in extra and cur not in base:
                extra.append(cur)
    return Vocabulary((*base, *extra, "<s>", "</s>"), tuple(merges))


@dataclass(frozen=True)
class LlamaShape:
    """The hyper-parameters a llama-architecture GGUF declares."""

    n_embd: int = 256
    """``llama.embedding_length``"""
    n_layer: int = 4
    """``llama.block_count``"""
    n_head: int = 4
    """``llama.attention.head_count`` (and its KV count: no grouped-query attention here)"""
    n_ff: int = 768
    """``llama.feed_forward_length``"""
    ctx: int = 4096
    """``llama.context_length``"""
    rms_eps: float = 1e-5
    """``llama.attention.layer_norm_rms_epsilon``"""
    rope_base: float = 10000.0
    """``llama.rope.freq_base``"""


def write_llama_gguf(
    path: Path, vocab: Vocabulary, shape: LlamaShape, tensors: dict[str, Any], *, name: str = "rollcut-tiny"
) -> None:
    """Write ``tensors`` (GGUF names, float32 arrays in llama.cpp's layout) as a llama GGUF, 0600."""
    import gguf  # the engine extra

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(shape.ctx)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head)
    w.add_rope_dimension_count(shape.n_embd // shape.n_head)
    w.add_rope_freq_base(shape.rope_base)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_vocab_size(len(vocab.tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(list(vocab.tokens))
    w.add_token_types([gguf.TokenType.NORMAL] * (len(vocab.tokens) - 2) + [gguf.TokenType.CONTROL] * 2)
    w.add_token_merges(list(vocab.merges))
    w.add_bos_token_id(vocab.bos_id)
    w.add_eos_token_id(vocab.eos_id)
    w.add_add_bos_token(False)
    w.add_chat_template(TINY_CHAT_TEMPLATE)
    for key in _tensor_order(shape.n_layer):
        w.add_tensor(key, tensors[key])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    path.chmod(0o600)


def _tensor_order(n_layer: int) -> list[str]:
    block = (
        "attn_norm",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_norm",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    )
    return [
        "token_embd.weight",
        *(f"blk.{i}.{n}.weight" for i in range(n_layer) for n in block),
        "output_norm.weight",
        "output.weight",
    ]


def write_tiny_gguf(
    path: Path,
    *,
    n_embd: int = 256,
    n_layer: int = 4,
    n_head: int = 4,
    n_ff: int = 768,
    ctx: int = 4096,
    seed: int = 0,
    ascii_only: bool = True,
) -> TinyModel:
    """Write the model to ``path`` (0600) and say what it holds."""
    shape = LlamaShape(n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_ff=n_ff, ctx=ctx)
    vocab = tiny_vocabulary()
    n_vocab = len(vocab.tokens)
    # bytes 0x80.. never end a UTF-8 character on their own (the ASCII model makes them unsampleable)
    non_ascii = tuple(range(0x80, 0x100))
    write_llama_gguf(
        path, vocab, shape, tiny_weights(shape, n_vocab, seed=seed, banned=_banned(vocab, ascii_only))
    )
    return TinyModel(path, n_vocab, vocab.bos_id, vocab.eos_id, () if ascii_only else non_ascii)


def _banned(vocab: Vocabulary, ascii_only: bool) -> list[int]:
    return [*range(0x80, 0x100), vocab.bos_id] if ascii_only else [vocab.bos_id]


def tiny_weights(shape: LlamaShape, n_vocab: int, *, seed: int, banned: list[int]) -> dict[str, Any]:
    """Seeded random weights under GGUF names, with the tokens in ``banned`` made unsampleable."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n_embd, n_ff = shape.n_embd, shape.n_ff

    def rand(*dims: int) -> Any:
        return (rng.standard_normal(dims) * 0.2).astype(np.float32)

    embd, out = rand(n_vocab, n_embd), rand(n_vocab, n_embd)
    blocks = {
        name: rand(*dims)
        for i in range(shape.n_layer)
        for name, dims in (
            (f"blk.{i}.attn_q.weight", (n_embd, n_embd)),
            (f"blk.{i}.attn_k.weight", (n_embd, n_embd)),
            (f"blk.{i}.attn_v.weight", (n_embd, n_embd)),
            (f"blk.{i}.attn_output.weight", (n_embd, n_embd)),
            (f"blk.{i}.ffn_gate.weight", (n_ff, n_embd)),
            (f"blk.{i}.ffn_up.weight", (n_ff, n_embd)),
            (f"blk.{i}.ffn_down.weight", (n_embd, n_ff)),
        )
    }
    # What can be sampled is decided by the output layer, and llama has no output bias. So the
    # residual stream's dimension 0 is made a constant: every embedding holds C there, no layer
    # reads it (zero input columns) or writes it (zero output rows). After the final norm it is
    # positive for every state, and a row with a large negative weight there (and nothing else)
    # has a logit far below every other: those tokens are never sampled.
    embd[:, 0] = 10.0
    for name, m in blocks.items():
        if name.endswith(("attn_output.weight", "ffn_down.weight")):
            m[0, :] = 0.0
        else:
            m[:, 0] = 0.0
    out[:, 0] = 0.0
    out[banned] = 0.0
    out[banned, 0] = -10.0
    ones = np.ones(n_embd, np.float32)
    norms = {f"blk.{i}.{n}.weight": ones for i in range(shape.n_layer) for n in ("attn_norm", "ffn_norm")}
    return {"token_embd.weight": embd, **blocks, **norms, "output_norm.weight": ones, "output.weight": out}
