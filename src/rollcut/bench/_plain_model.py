"""The baseline of ``bench model``: the same model server, without custody.

Same FastAPI app (``create_app``: routes, request checks, response shapes),
same uvicorn, same local backend and plans; the service answers each call
from the backend alone: no admitted or completed event, no token-store write,
no fence or lineage lookups. What ``bench model`` measures against it is the
cost of custody itself. Served by the plain stack (``python -m rollcut.bench._plain_serve model``).
"""

from __future__ import annotations

from typing import Any, cast

from ..bus import EventLog, TokenReceipt
from ..gym.model import DEFAULT_MODEL, Backend, CallResult, ModelService, OnToken
from ..gym.wire import Identity
from ..tokens import TokenRecord, TokenStore

__all__ = ["PlainModelService"]

_NO_RECEIPT = TokenReceipt(receipt_id="none", count=0, digest="0" * 32)


class PlainModelService(ModelService):
    """A model service that only generates: the baseline without custody."""

    def __init__(self, backend: Backend, *, model_name: str = DEFAULT_MODEL) -> None:
        super().__init__(
            cast(EventLog, None), cast(TokenStore, None), backend, instance="plain", model_name=model_name
        )

    async def call(
        self, ident: Identity, body: dict[str, Any], on_token: OnToken | None = None
    ) -> CallResult:
        _, call_id = self.call_identity(ident, body)
        plan = await self.backend.start(body)
        out: list[int] = []
        async for tok in self.backend.generate(plan):
            out.append(tok)
            if on_token is not None:
                i = len(out) - 1
                await on_token(tok, self.backend.piece(plan, i), plan.logprob(i))
        self.stats.inc("calls_generated")
        return CallResult(call_id, plan, out, _NO_RECEIPT)

    async def training_record(self, result: CallResult) -> TokenRecord:
        """The token arrays from the generation itself (a plain server keeps no store)."""
        plan, out = result.plan, result.output_ids
        return TokenRecord(
            prompt_ids=plan.prompt_ids,
            output_ids=out,
            mask=[1] * len(out),
            logprobs=plan.logprobs[: len(out)],
            policy_version=self._policy_version(),
        )
