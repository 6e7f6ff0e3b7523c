"""Log-probs as OpenAI gives them, with each token's text from the backend that made the token.

OpenAI's ``ChatCompletionTokenLogprob`` (and the Responses ``Logprob``) carries a token's
``token`` text and its ``bytes``. A token is a run of bytes, not always a whole character: a
byte-fallback token (SentencePiece's ``<0xE2>``) or a byte-level BPE token can end mid-character.
OpenAI then reports the bytes it has and writes the ones no character completes as ``\\xNN``
escapes in ``token`` (so joining the ``bytes`` of consecutive tokens gives the text). The same
here: ``token`` is the bytes decoded with Python's ``backslashreplace``.

Whose bytes: the backend's, never a guess. The local backend's tokens are bytes by construction;
an engine's are asked of the engine's own detokenizer (:class:`~.engine.EngineBackend`); a
backend that cannot say (the ``openai`` proxy: its upstream's ids come back without text) does not
implement :class:`TokenTexts`, and a request asking it for log-probs is refused in OpenAI's error
shape before anything is generated, never answered without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..wire import ErrorKind, GymError

__all__ = ["TokenText", "TokenTexts", "asks_logprobs", "logprob_entries", "of_bytes", "refuse_without"]


@dataclass(frozen=True)
class TokenText:
    """One token as OpenAI's log-probs name it: its text, and its bytes (None: unknown)."""

    token: str
    bytes: list[int] | None


def of_bytes(raw: bytes) -> TokenText:
    """A token whose bytes are known: bytes no character completes are ``\\xNN`` in its text."""
    return TokenText(raw.decode("utf-8", "backslashreplace"), list(raw))


@runtime_checkable
class TokenTexts(Protocol):
    """A backend that can say what text each of its token ids is (and so give log-probs)."""

    async def token_texts(self, ids: Sequence[int]) -> list[TokenText]: ...


def asks_logprobs(body: dict[str, Any]) -> bool:
    """Whether a request (chat, or Responses with its ``include``) asks for log-probs."""
    include = body.get("include")
    return bool(body.get("logprobs")) or (
        isinstance(include, list) and "message.output_text.logprobs" in include
    )


def refuse_without(backend: Any, body: dict[str, Any], route: str) -> None:
    """A 400 in OpenAI's shape when a request asks for log-probs of a backend that has no token text."""
    if asks_logprobs(body) and not isinstance(backend, TokenTexts):
        raise GymError(
            ErrorKind.UNSUPPORTED,
            f"{route}: logprobs: the {getattr(backend, 'name', 'configured')} backend cannot say which "
            "text each generated token is; use the engine or local backend",
            param="logprobs",
        )


async def logprob_entries(
    backend: Any, ids: Sequence[int], logprobs: Sequence[float]
) -> list[dict[str, Any]]:
    """One ``{token, bytes, logprob, top_logprobs}`` per token (the alternatives are not kept:
    ``top_logprobs`` above 0 is refused when the request is checked)."""
    assert isinstance(backend, TokenTexts)  # refuse_without ran when the request was checked
    n = min(len(ids), len(logprobs))
    texts = await backend.token_texts(list(ids[:n]))
    return [
        {"token": t.token, "bytes": t.bytes, "logprob": lp, "top_logprobs": []}
        for t, lp in zip(texts, logprobs[:n], strict=True)
    ]
