"""Token custody: the contracts a token store satisfies, and the local default."""

from ._contracts import (
    LineageStore,
    TokenRecord,
    TokenSink,
    TokenSnapshot,
    TokenSource,
    TokenStore,
    call_store,
)
from ._local import LocalTokenStore

__all__ = [
    "LineageStore",
    "LocalTokenStore",
    "TokenRecord",
    "TokenSink",
    "TokenSnapshot",
    "TokenSource",
    "TokenStore",
    "call_store",
]
