"""Write a tiny Hugging Face model for vLLM: random Llama weights in safetensors, a byte-level BPE
tokenizer made with ``tokenizers``, and a chat template. No hub: everything is made here.

Run with the vLLM environment's own Python (it has torch, transformers and tokenizers; rollcut's
environment needs none of them): ``python tiny_hf.py OUT_DIR``. It imports nothing of rollcut.

Shape: 2 layers, hidden 256, 4 heads (head dim 64: vLLM's CPU attention takes 32, 64, 80, 96, 112,
128 or 256 with AVX2; 16 is refused), float32; a vocabulary of the 256 byte tokens, a few merges, and
``<s>``/``</s>``. The weights are seeded, so the same directory is written every time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

_WORDS = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "you",
    "that",
    "was",
    "for",
    "on",
    "are",
    "with",
    "as",
    "his",
    "they",
    "be",
    "at",
    "one",
    "have",
    "this",
    "from",
]


def write(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<s>": 0, "</s>": 1}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    merges: list[tuple[str, str]] = []
    space = "\u0120"  # the byte-level alphabet's space
    for word in _WORDS:
        piece = space + word
        cur = piece[0]
        for ch in piece[1:]:
            if cur + ch not in vocab:
                merges.append((cur, ch))
                vocab[cur + ch] = len(vocab)
            cur += ch
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = (
        "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    fast.save_pretrained(out)
    cfg = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(out, safe_serialization=True)
    # the tokens of bytes 0x80-0xFF: a random model samples them alone, mid-character; a test that
    # needs every streamed token to be a whole character bans them (as the tiny GGUF leaves them out)
    non_ascii = sorted(vocab[_byte_char(b)] for b in range(0x80, 0x100))
    (out / "rollcut.json").write_text(
        json.dumps({"eos_id": 1, "vocab": len(vocab), "non_ascii_ids": non_ascii})
    )


def _byte_char(b: int) -> str:
    """The character byte-level BPE writes byte ``b`` as: printable Latin-1 bytes stand for
    themselves, the others are moved past U+0100 in order (GPT-2's convention)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    if b in printable:
        return chr(b)
    return chr(0x100 + [x for x in range(256) if x not in printable].index(b))


if __name__ == "__main__":
    write(Path(sys.argv[1]))
