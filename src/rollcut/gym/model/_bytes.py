"""The byte-level stand-in tokenizer: a token is a UTF-8 byte (id = byte + 3; 0-2 reserved).

What the local backend generates in (reversible, so any prefix of a planned answer decodes), and
what a call is recorded in when an upstream gives no token ids of its own (the ``openai`` proxy's
``+bytes`` policy version). Never an engine's ids: an engine's tokens are its own, and their text
is asked of it (``engine/_pieces``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["OFFSET", "decode", "encode", "render_prompt"]

OFFSET = 3
"""Ids below it are reserved (no byte)."""


def encode(text: str) -> list[int]:
    """Text to the local backend's byte-level token ids."""
    return [b + OFFSET for b in text.encode("utf-8")]


def decode(ids: list[int]) -> str:
    """Token ids of the local backend back to text."""
    return bytes(i - OFFSET for i in ids if OFFSET <= i < OFFSET + 256).decode("utf-8", "replace")


def render_prompt(messages: list[dict[str, Any]]) -> str:
    """The chat transcript as the text the tokenizer sees."""
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts
            content = "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
        calls = m.get("tool_calls") or []
        call_text = "".join(
            f"<call>{c.get('function', {}).get('name')}({c.get('function', {}).get('arguments')})</call>"
            for c in calls
        )
        parts.append(f"<{m.get('role', 'user')}>{content or ''}{call_text}</{m.get('role', 'user')}>\n")
    return "".join(parts)
