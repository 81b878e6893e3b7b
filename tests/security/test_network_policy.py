"""Sandbox networking under attack (issue 35, holes 3 and 5), on an edge whose uplink is the
test "internet" of tests/integration/netlab.py (no packet leaves the machine).

- The node's DNS forwarder is a destination like any other for the per-sandbox connection caps:
  queries from fresh source ports may not fill the node's conntrack table (it is host-wide:
  a full table makes every neighbour's connects fail).
- A PATCH to a stricter policy holds for flows the old one opened: a remote peer cannot go on
  pushing datagrams into an established UDP flow, while a TCP connection the new policy still
  allows survives the change.
"""

import json
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


# Every way a socket can name a destination, each at the node's gateway (TCP), the metadata
# address, a neighbour and an unlisted private address: connect (IPv4, and IPv6 with a
# v4-mapped address), an unconnected UDP sendto (v4 and v4-mapped v6), TCP Fast Open's sendto
# with MSG_FASTOPEN (a connect inside sendmsg), a UDP connect, an IPv6 destination; prints
# {case: "ok" | errno name}.
EVASIONS = r"""
import errno, json, socket, sys
out = {}
def attempt(name, fn):
    try:
        fn(); out[name] = "ok"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, repr(e))
for label, host in json.loads(sys.argv[1]).items():
    mapped = "::ffff:" + host
    def tcp4(): socket.create_connection((host, 80), timeout=2).close()
    def tcp6(): s = socket.socket(socket.AF_INET6); s.settimeout(2); s.connect((mapped, 80))
    def udp4(): socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", (host, 53 if label == "gateway" else 9))
    def udp6(): socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).sendto(b"x", (mapped, 9))
    def udpc(): socket.socket(socket.AF_INET, socket.SOCK_DGRAM).connect((host, 9))
    def tfo(): socket.socket().sendto(b"GET / HTTP/1.0\r\n\r\n", socket.MSG_FASTOPEN, (host, 80))
    for name, fn in (("tcp4", tcp4), ("tcp6-mapped", tcp6), ("udp4", udp4), ("udp6-mapped", udp6),
                     ("udp-connect", udpc), ("tcp-fastopen", tfo)):
        attempt(f"{label} {name}", fn)
attempt("ipv6 global", lambda: socket.socket(socket.AF_INET6).connect(("2001:db8::1", 80)))
print(json.dumps(out))
"""


def test_the_egress_guard_refuses_every_way_of_naming_a_forbidden_destination(lab, figure):
    """An open sandbox names the node's gateway, the metadata address, a neighbour and a private
    address no rule names through every socket call that carries a destination (TCP and UDP
    connect, IPv4 and v4-mapped IPv6, unconnected UDP sendto, TCP Fast Open's sendto, an IPv6
    address): each fails EPERM at the call (the egress guard, before any packet), but DNS to
    the gateway over UDP; every refusal is counted in the sandbox's stats."""
    e = Edge.start(netns=lab.node, config={"network_cidr": "10.217.0.0/16",
                                           "network_dns": netlab.DNS})
    try:
        c = e.client()
        a = c.create({"network": {"mode": "open"}})
        b = c.create({"network": {"mode": "open"}})
        guard = c.get("/v1/node", expect=200).json["features"]["network"]["egress_guard"]
        if guard != "on":
            pytest.skip(f"no egress guard on this edge: {guard}")
        targets = {"gateway": "10.217.0.1", "metadata": "169.254.169.254",
                   "neighbour": b["network"]["address"], "private": netlab.PRIVATE}
        out = c.exec(a["id"], cmd=["python3", "-c", EVASIONS, json.dumps(targets)])
        assert out["exit_code"] == 0, out
        got = json.loads(out["stdout"])
        assert got.pop("gateway udp4") == "ok", got  # DNS to the node's forwarder
        refused = {k: v for k, v in got.items() if v == "EPERM"}
        assert refused == got, {k: v for k, v in got.items() if v != "EPERM"}
        # 6 calls at each of 4 targets, but DNS, and the IPv6 address.
        assert len(refused) == len(targets) * 6 - 1 + 1, got
        st = c.get(f"/v1/sandboxes/{a['id']}/stats", expect=200).json
        assert st["network_denied"] >= len(refused), st
        figure("calls refused EPERM at the call", len(refused))
        figure("network_denied in its stats", st["network_denied"])
        c.remove(a["id"])
        c.remove(b["id"])
    finally:
        edge_fixtures._teardown(e)
