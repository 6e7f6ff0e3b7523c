"""The link shaper between two test hosts (network namespaces): what it is set to do to packets, it
does, each way, changed during a run (real namespaces, TUN devices and kernels; as root)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from rollcut.testing import LinkShape

from ..hosts import Hosts, hosts_available

pytestmark = pytest.mark.slow

ECHO = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 33, 1 << 24)  # SO_RCVBUFFORCE: a burst is held, not overrun
s.bind((sys.argv[1], 9999))
print("up", flush=True)
while True:
    data, peer = s.recvfrom(2048)
    s.sendto(data, peer)
"""

PROBE = """
import json, socket, sys, time
host, n, gap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 33, 1 << 24)  # SO_RCVBUFFORCE: the echoes wait while it sends
s.settimeout(0.5)
sent = {}
for i in range(n):
    sent[i] = time.monotonic()
    s.sendto(str(i).encode(), (host, 9999))
    time.sleep(gap)
got, order, rtts, last = set(), [], [], 0.0
deadline = time.monotonic() + 5
while time.monotonic() < deadline and len(got) < n:
    try:
        data = s.recv(2048)
    except socket.timeout:
        continue
    i = int(data)
    order.append(i)
    last = time.monotonic()
    if i not in got:
        got.add(i)
        rtts.append(time.monotonic() - sent[i])
out = {"received": len(order), "unique": len(got), "order": order, "min_rtt": min(rtts, default=None)}
out["span"] = last - sent[0]
print(json.dumps(out))
"""


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    hosts_available()
    with Hosts(["a", "b"]) as made:
        echo = subprocess.Popen(
            [*made.on("b"), sys.executable, "-c", ECHO, made.addr["b"]], stdout=subprocess.PIPE, text=True
        )
        try:
            assert echo.stdout is not None and echo.stdout.readline().strip() == "up"
            yield made
        finally:
            echo.kill()
            echo.wait()


def _probe(hosts: Hosts, n: int, gap_s: float = 0.0) -> dict[str, object]:
    done = subprocess.run(
        [*hosts.on("a"), sys.executable, "-c", PROBE, hosts.addr["b"], str(n), str(gap_s)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, object] = json.loads(done.stdout)
    return out


def test_a_delayed_link_holds_every_packet_each_way_and_a_lossy_one_drops_what_it_counts(
    hosts: Hosts,
) -> None:
    assert _probe(hosts, 20)["unique"] == 20  # the bridge, unshaped
    hosts.shape("a", "b", LinkShape(delay_s=0.15), LinkShape(delay_s=0.05))
    slow = _probe(hosts, 20)
    assert slow["unique"] == 20
    assert isinstance(slow["min_rtt"], float) and slow["min_rtt"] >= 0.2  # 150 ms there, 50 ms back
    before = hosts.shaper_counts()
    hosts.shape("a", "b", LinkShape(loss=0.2))  # changed during the run, both ways
    lossy = _probe(hosts, 400)
    counts = {k: v - before[k] for k, v in hosts.shaper_counts().items()}
    # each request and each echo crosses the shaper: what it dropped is what did not come back
    assert counts["dropped"] > 0 and counts["written"] == counts["read"] - counts["dropped"]
    # every round trip lost is one the shaper dropped (either way), none lost elsewhere; it may also
    # have dropped a stray packet of the hosts' own (an ICMP error), which costs no round trip
    lost = 400 - int(str(lossy["received"]))
    assert 0 < lost <= counts["dropped"] <= lost + 3
    assert 400 * 0.5 < int(str(lossy["received"])) < 400 * 0.8  # about 0.8 x 0.8 of them


def test_duplication_reordering_and_a_bandwidth_cap_reach_the_other_end(hosts: Hosts) -> None:
    hosts.shape("a", "b", LinkShape(duplicate=0.5), LinkShape())
    doubled = _probe(hosts, 200)
    assert doubled["unique"] == 200 and int(str(doubled["received"])) > 200
    hosts.shape("a", "b", LinkShape(delay_s=0.05, jitter_s=0.04), LinkShape())
    jittered = _probe(hosts, 200, gap_s=0.002)
    order = jittered["order"]
    assert isinstance(order, list) and sorted(order) == list(range(200)) and order != sorted(order)
    hosts.shape("a", "b", LinkShape(rate_bps=64_000), LinkShape())
    capped = _probe(hosts, 100)
    # 100 datagrams of at least 29 bytes (IP, UDP, a digit) through 64 kbit/s take this long at least
    assert capped["unique"] == 100 and float(str(capped["span"])) >= 100 * 29 * 8 / 64_000
