"""A bounded memory of recent keys: servers that run for weeks must not grow without end."""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

__all__ = ["remember"]

K = TypeVar("K")
V = TypeVar("V")


def remember(memory: OrderedDict[K, V], key: K, value: V, cap: int) -> None:
    """Keep ``key -> value`` as the newest entry, forgetting the oldest beyond ``cap``."""
    memory[key] = value
    while len(memory) > cap:
        memory.popitem(last=False)
