"""Sandbox networking under attack (issue 35, holes 3 and 5), on an edge whose uplink is the
test "internet" of tests/integration/netlab.py (no packet leaves the machine).

- The node's DNS forwarder is a destination like any other for the per-sandbox connection caps:
  queries from fresh source ports may not fill the node's conntrack table (it is host-wide:
  a full table makes every neighbour's connects fail).
- A PATCH to a stricter policy holds for flows the old one opened: a remote peer cannot go on
  pushing datagrams into an established UDP flow, while a TCP connection the new policy still
  allows survives the change.
"""

import time

import pytest

import edge_fixtures
import netlab
from edge_harness import Edge
from netlab import PROBE, PUBLIC

REASON = edge_fixtures.SKIP_REASON or netlab.why_not_available()
pytestmark = pytest.mark.skipif(bool(REASON), reason=REASON or "")


@pytest.fixture(scope="module")
def lab():
    with netlab.NetLab() as lab:
        yield lab


def entries_of(lab, addr):
    return [line for line in lab.conntrack().splitlines() if f"src={addr} " in line]


# Queries the gateway's DNS from a fresh source port each time, each valid query sent twice on
# its port (the second makes a UDP entry "assured", which early drop cannot evict), for the
# given seconds; prints how many ports it used.
DNS_FLOOD = r"""
import socket, struct, sys, time
gw, secs = sys.argv[1], float(sys.argv[2])
q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"\x04pypi\x04test\x00\x00\x01\x00\x01"
ports, end = 0, time.monotonic() + secs
held = []
while time.monotonic() < end:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    try:
        s.sendto(q, (gw, 53))
        s.sendto(q, (gw, 53))
    except OSError:
        pass
    held.append(s)
    ports += 1
    if len(held) > 500:
        for h in held:
            h.close()
        held = []
print(ports)
"""


RESOLVE = "import socket, sys; print(socket.gethostbyname(sys.argv[1]))"


def test_dns_queries_count_against_the_sandboxs_connection_cap(lab, figure):
    """A sandbox sends DNS queries to the node's forwarder from thousands of fresh source ports
    (each twice, so its entries are assured): its tracked flows stay within network_max_conns,
    while a neighbour still resolves names and connects at its usual speed."""
    e = Edge.start(netns=lab.node, config={"network_cidr": "10.216.0.0/16",
                                           "network_dns": netlab.DNS,
                                           "network_max_conns": 64,
                                           "network_new_conns_per_s": 100})
    try:
        c = e.client()
        policy = {"mode": "allowlist", "domains": ["pypi.test"], "rules": [
            {"cidr": PUBLIC, "ports": "8080"}]}
        flood = c.create({"network": policy})
        neighbour = c.create({"network": policy})["id"]
        addr = flood["network"]["address"]
        gw = addr.rsplit(".", 2)[0] + ".0.1"
        bg = c.exec(flood["id"], cmd=["python3", "-c", DNS_FLOOD, gw, "3"], background=True,
                    expect=202)["exec_id"]
        times, peak = [], 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            peak = max(peak, len(entries_of(lab, addr)))
            out = c.exec(neighbour, cmd=["python3", "-c", RESOLVE, "pypi.test"])
            assert out["stdout"].strip() == PUBLIC, out
            result = c.exec(neighbour, cmd=["python3", "-c", PROBE, PUBLIC, "8080"])["stdout"]
            assert result.startswith("ok"), result
            times.append(int(result.split()[1]))
        done = c.get(f"/v1/sandboxes/{flood['id']}/execs/{bg}?wait_ms=60000", expect=200).json
        peak = max(peak, len(entries_of(lab, addr)))
        figure("source ports the flood used", int(done["result"]["stdout"]))
        figure("its tracked flows at most (cap 64)", peak)
        figure("neighbour connect ms max", max(times))
        assert int(done["result"]["stdout"]) > 500, done
        assert peak <= 64 + 2, peak
        assert max(times) < 1000, times
        for sid in (flood["id"], neighbour):
            c.remove(sid)
        c.close()
    finally:
        edge_fixtures._teardown(e)


# A UDP peer in the test internet: once a datagram arrives, it sends one back to its sender
# every 50 ms for 30 s.
PUSHER = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
_, peer = s.recvfrom(100)
end = time.monotonic() + 30
while time.monotonic() < end:
    s.sendto(b"push", peer)
    time.sleep(0.05)
"""

# Opens the flow, then counts datagrams per phase: writes the count so far to /tmp/pushed.
LISTEN = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(0.2)
n, end = 0, time.monotonic() + 25
while time.monotonic() < end:
    if n == 0:  # until the peer answers (it may not listen yet)
        s.sendto(b"hi", (sys.argv[1], int(sys.argv[2])))
    try:
        s.recv(100)
        n += 1
        open("/tmp/pushed", "w").write(str(n))
    except socket.timeout:
        pass
"""

# Keeps one TCP connection to the echo server and echoes through it once per 100 ms, writing
# how many round trips worked and the last error to /tmp/echo.
ECHO_LOOP = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], 7), timeout=3)
ok, err, end = 0, "", time.monotonic() + 25
while time.monotonic() < end:
    try:
        s.sendall(b"x")
        if s.recv(1) == b"x":
            ok += 1
    except OSError as e:
        err = type(e).__name__
        break
    open("/tmp/echo", "w").write(f"{ok} {err}")
    time.sleep(0.1)
open("/tmp/echo", "w").write(f"{ok} {err}")
"""


def test_a_stricter_policy_cuts_udp_flows_and_keeps_allowed_tcp(lab, figure):
    """An open sandbox opens a UDP flow to a peer that keeps pushing datagrams, and a TCP
    connection to an echo server; a PATCH to an allowlist of only the echo server stops the
    peer's datagrams at once, while the allowed TCP connection keeps working."""
    e = Edge.start(netns=lab.node, config={"network_cidr": "10.217.0.0/16"})
    pusher = lab.spawn(lab.internet, ["python3", "-c", PUSHER, PUBLIC, "9999"])
    try:
        c = e.client()
        sid = c.create({"network": {"mode": "open"}})["id"]
        c.exec(sid, cmd=["python3", "-c", LISTEN, PUBLIC, "9999"], background=True, expect=202)
        c.exec(sid, cmd=["python3", "-c", ECHO_LOOP, PUBLIC], background=True, expect=202)

        def count(path):
            return c.exec(sid, f"cat {path} 2>/dev/null")["stdout"]

        deadline = time.monotonic() + 10
        while not count("/tmp/pushed") or int(count("/tmp/pushed")) < 5:
            assert time.monotonic() < deadline, "the peer's datagrams did not arrive"
            time.sleep(0.1)
        c.patch(f"/v1/sandboxes/{sid}", {"network": {"mode": "allowlist", "rules": [
            {"cidr": PUBLIC, "ports": "7", "proto": "tcp"}]}}, expect=200)
        at_patch = int(count("/tmp/pushed"))
        echo_at_patch = int(count("/tmp/echo").split()[0])
        time.sleep(2)
        after = int(count("/tmp/pushed")) - at_patch
        echo = count("/tmp/echo").split()
        figure("datagrams received in the 2 s after the PATCH", after)
        figure("TCP echoes in the 2 s after the PATCH", int(echo[0]) - echo_at_patch)
        assert after <= 1, after  # one may have been in flight
        assert len(echo) == 1 and int(echo[0]) > echo_at_patch + 5, echo
        c.remove(sid)
        c.close()
    finally:
        pusher.kill()
        edge_fixtures._teardown(e)
