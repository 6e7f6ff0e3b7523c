"""A link between two test hosts that loses, delays, reorders, duplicates and rate-limits packets.

This kernel has no ``sch_netem`` (and no iptables or nft), so the weather of a real network is made
in user space, as netem would make it in the kernel: each end of a shaped link gets a TUN device
in its namespace, and a /32 route to the other end through it, more specific than the bridge's
/24. Every IP packet one end sends to the other is then read from its TUN by the shaper process
(``python -m rollcut.testing._shaper``, started by :class:`rollcut.testing.Hosts`), which decides
its fate by the direction's :class:`LinkShape` and writes it, when due, into the other end's TUN:
the other kernel receives it as if from a wire.

What it models: independent loss per packet, a one-way delay with uniform jitter (which reorders
packets whose delays cross), extra reordering (a packet sent ahead of those waiting), duplication,
and a bandwidth cap (a packet occupies the link for its size over the rate; one queue per
direction, unbounded, so a cap adds delay rather than tail drops). What it does not: correlated
(bursty) loss, corruption, a bounded queue's drops, MTU changes, anything below IP (ARP, the
link's own state: a cut link is :meth:`Hosts.cut`). Its randomness is seeded, so a run's fate
of packets follows from its traffic. Shapes change during a run (``Hosts.shape`` again).

The shaper enters a namespace only to open that end's TUN device (``setns`` on its own thread,
through libc: Python 3.11 has no ``os.setns``); the device stays in the namespace it was made in,
and the file descriptor works from anywhere. Control is one JSON object per line on its stdin,
answered by one line on its stdout.
"""

from __future__ import annotations

import ctypes
import fcntl
import heapq
import json
import os
import random
import selectors
import struct
import sys
import time
from typing import Any

import msgspec

from ._linkshape import LinkShape

__all__: list[str] = []  # a program: python -m rollcut.testing._shaper SEED

_TUNSETIFF = 0x400454CA
_IFF_TUN, _IFF_NO_PI = 0x0001, 0x1000
_CLONE_NEWNET = 0x40000000
_MAX_PACKET = 65_535


class _Direction:
    def __init__(self, out_fd: int) -> None:
        self.out_fd = out_fd
        self.shape = LinkShape()
        self.busy_until = 0.0


def _enter(ns: str) -> int:
    """Enter network namespace ``ns`` (its ``ip netns`` name); returns a handle to go back."""
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(target, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns}")
    finally:
        os.close(target)
    return own


def _leave(own: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        if libc.setns(own, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns back")
    finally:
        os.close(own)


def _open_tun(ns: str | None, name: str) -> int:
    """A TUN device ``name`` made in namespace ``ns`` (None: this one); its file descriptor."""
    own = _enter(ns) if ns is not None else None
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
        return fd
    finally:
        if own is not None:
            _leave(own)


class _Shaper:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.tuns: dict[str, int] = {}
        self.directions: dict[int, _Direction] = {}  # read fd -> where its packets go, and how
        self.held: list[tuple[float, int, int, bytes]] = []  # (due, order, out fd, packet)
        self.order = 0
        self.sel = selectors.DefaultSelector()
        self.counts = {"read": 0, "dropped": 0, "duplicated": 0, "written": 0, "refused": 0}

    def control(self, line: str) -> dict[str, Any]:
        msg = json.loads(line)
        op = msg["op"]
        if op == "tun":
            fd = _open_tun(msg.get("ns"), msg["name"])
            self.tuns[msg["name"]] = fd
            return {"ok": True}
        if op == "pair":  # packets read from one go to the other, both ways
            x, y = self.tuns[msg["x"]], self.tuns[msg["y"]]
            for src, dst in ((x, y), (y, x)):
                self.directions[src] = _Direction(dst)
                self.sel.register(src, selectors.EVENT_READ)
            return {"ok": True}
        if op == "shape":  # the direction out of tun ``from``
            self.directions[self.tuns[msg["from"]]].shape = msgspec.convert(msg["shape"], LinkShape)
            return {"ok": True}
        if op == "counts":
            return {"ok": True, **self.counts}
        raise ValueError(f"unknown op {op!r}")

    def packet(self, src: int, data: bytes, now: float) -> None:
        d = self.directions[src]
        s, rng = d.shape, self.rng
        self.counts["read"] += 1
        if s.loss and rng.random() < s.loss:
            self.counts["dropped"] += 1
            return
        copies = 2 if s.duplicate and rng.random() < s.duplicate else 1
        self.counts["duplicated"] += copies - 1
        for _ in range(copies):
            if s.reorder and rng.random() < s.reorder:
                due = now
            else:
                due = now + max(
                    0.0, s.delay_s + (rng.uniform(-s.jitter_s, s.jitter_s) if s.jitter_s else 0.0)
                )
            if s.rate_bps:
                start = max(due, d.busy_until)
                d.busy_until = start + len(data) * 8 / s.rate_bps
                due = d.busy_until
            self.order += 1
            heapq.heappush(self.held, (due, self.order, d.out_fd, data))

    def release(self, now: float) -> None:
        while self.held and self.held[0][0] <= now:
            _, _, out, data = heapq.heappop(self.held)
            try:
                os.write(out, data)
                self.counts["written"] += 1
            except OSError:  # the other end's device is down (a cut link): the packet is lost there
                self.counts["refused"] += 1

    def run(self) -> None:
        self.sel.register(sys.stdin.fileno(), selectors.EVENT_READ)
        stdin = os.fdopen(sys.stdin.fileno(), "r", buffering=1)
        print(json.dumps({"ready": True}), flush=True)
        while True:
            now = time.monotonic()
            self.release(now)
            timeout = max(0.0, self.held[0][0] - now) if self.held else None
            for key, _ in self.sel.select(timeout):
                if key.fd == sys.stdin.fileno():
                    line = stdin.readline()
                    if not line:
                        return  # the parent is gone: so is every shaped link
                    try:
                        answer = self.control(line)
                    except Exception as exc:
                        answer = {"ok": False, "error": repr(exc)}
                    print(json.dumps(answer), flush=True)
                    continue
                while True:  # drain what the device holds
                    try:
                        data = os.read(key.fd, _MAX_PACKET)
                    except BlockingIOError:
                        break
                    self.packet(key.fd, data, time.monotonic())


if __name__ == "__main__":
    _Shaper(int(sys.argv[1]) if len(sys.argv) > 1 else 0).run()
