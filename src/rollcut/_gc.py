"""Holding the cyclic garbage collector off while a page of records is decoded.

Why: decoding a page allocates tens of thousands of small dicts and lists (tool
arguments, results, output items), and a replay keeps most of them alive in
its sessions. CPython 3.11 counts every allocation towards a young collection
and, as the surviving heap grows, runs full collections that walk all of it:
measured on a 20k-event replay that was 3 to 5 µs of an event's 7 µs decode.
Decoded msgpack is a tree (it cannot form a reference cycle), so nothing the
collector could free is made inside the pause; the young objects are counted
and collected as usual once the page is done. A pause lasts one page (a few
milliseconds), nests, and is shared by threads: the collector is enabled again
when the last pause ends, and only if it was enabled when the first began.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused"]

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def paused() -> Iterator[None]:
    """No automatic cyclic collection inside the block (never await inside it)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
