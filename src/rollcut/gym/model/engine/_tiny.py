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

__all__ = ["TinyModel", "write_tiny_gguf"]

_WORDS = ("the", "agent", "tool", "call", "result", "step", "and", "answer", "counter", "value")
_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


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
    import gguf  # the engine extra
    import numpy as np

    rng = np.random.default_rng(seed)
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
    tokens = [*base, *extra, "<s>", "</s>"]
    n_vocab = len(tokens)
    kinds = [gguf.TokenType.NORMAL] * (len(base) + len(extra)) + [gguf.TokenType.CONTROL] * 2
    # bytes 0x80.. never end a UTF-8 character on their own (the ASCII model makes them unsampleable)
    non_ascii = tuple(range(0x80, 0x100))
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("rollcut-tiny")
    w.add_context_length(ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(kinds)
    w.add_token_merges(merges)
    w.add_bos_token_id(n_vocab - 2)
    w.add_eos_token_id(n_vocab - 1)
    w.add_add_bos_token(False)
    w.add_chat_template(_TEMPLATE)

    def rand(*shape: int) -> Any:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    embd, out = rand(n_vocab, n_embd), rand(n_vocab, n_embd)
    blocks = {
        name: rand(*shape)
        for i in range(n_layer)
        for name, shape in (
            (f"blk.{i}.attn_q.weight", (n_embd, n_embd)),
            (f"blk.{i}.attn_k.weight", (n_embd, n_embd)),
            (f"blk.{i}.attn_v.weight", (n_embd, n_embd)),
            (f"blk.{i}.attn_output.weight", (n_embd, n_embd)),
            (f"blk.{i}.ffn_gate.weight", (n_ff, n_embd)),
            (f"blk.{i}.ffn_up.weight", (n_ff, n_embd)),
            (f"blk.{i}.ffn_down.weight", (n_embd, n_ff)),
        )
    }
    unsampled = [*non_ascii, n_vocab - 2] if ascii_only else [n_vocab - 2]
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
    out[unsampled] = 0.0
    out[unsampled, 0] = -10.0
    w.add_tensor("token_embd.weight", embd)
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", blocks[f"blk.{i}.{name}.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, np.float32))
        for name in ("ffn_gate", "ffn_up", "ffn_down"):
            w.add_tensor(f"blk.{i}.{name}.weight", blocks[f"blk.{i}.{name}.weight"])
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor("output.weight", out)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    path.chmod(0o600)
    return TinyModel(path, n_vocab, n_vocab - 2, n_vocab - 1, () if ascii_only else non_ascii)
