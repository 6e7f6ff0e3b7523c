"""What a shaped link does to the packets of one direction (:mod:`._shaper` does it)."""

from __future__ import annotations

import msgspec

__all__ = ["LinkShape"]


class LinkShape(msgspec.Struct, frozen=True, kw_only=True):
    """One direction of a shaped link (netem's parameters, in user space)."""

    loss: float = 0.0
    """The probability a packet is dropped (0.01 is 1 %)."""
    delay_s: float = 0.0
    """The one-way delay every packet is held for."""
    jitter_s: float = 0.0
    """Each packet's delay varies by up to this much either way (uniform): crossing delays reorder."""
    reorder: float = 0.0
    """The probability a packet skips the delay and goes out at once, ahead of those held."""
    duplicate: float = 0.0
    """The probability a packet is delivered twice."""
    rate_bps: float = 0.0
    """The link's bandwidth in bits per second (0: unlimited)."""
