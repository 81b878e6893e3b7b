"""Network isolation (issue 6): a sandbox with the default network mode `none` has loopback
only. Every case connects (or sends) from inside a sandbox and checks the specific errno; each
target is first shown reachable from where it lives (the host, or its own sandbox), so an
"unreachable" can only mean isolation, not a dead target."""

import json
import secrets
import socket
import subprocess

import pytest

from edge_harness import wait_until

# Connects (TCP), sends (UDP) or connects a unix socket ("@name" = abstract) to each target;
# prints {key: "connected" | "sent" | ERRNO}.
CONNECT = r"""
import errno, json, socket, sys
out = {}
for fam, host, port, proto in json.loads(sys.argv[1]):
    key = f"{proto}:{host}:{port}"
    f = {"inet": socket.AF_INET, "inet6": socket.AF_INET6, "unix": socket.AF_UNIX}[fam]
    try:
        s = socket.socket(f, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
        s.settimeout(3)
        if fam == "unix":
            s.connect("\0" + host[1:] if host.startswith("@") else host)
            out[key] = "connected"
        elif proto == "tcp":
            s.connect((host, port))
            out[key] = "connected"
        else:
            s.sendto(b"ping", (host, port))
            out[key] = "sent"
        s.close()
    except socket.timeout:
        out[key] = "timeout"
    except OSError as e:
        out[key] = errno.errorcode.get(e.errno, repr(e))
print(json.dumps(out))
"""


def connect_from(client, sid, targets):
    r = client.exec(sid, cmd=["python3", "-c", CONNECT, json.dumps(targets)], timeout_ms=60000)
    assert r["exit_code"] == 0, r
    return json.loads(r["stdout"])


def key(t):
    return f"{t[3]}:{t[1]}:{t[2]}"


def host_addresses():
    """The host's non-loopback addresses (IPv4 and IPv6 global)."""
    out = []
    try:
        text = subprocess.run(["ip", "-o", "addr", "show", "scope", "global"],
                              capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return out
    for line in text.splitlines():
        f = line.split()
        if len(f) > 3 and f[2] in ("inet", "inet6"):
            out.append((f[2], f[3].split("/")[0]))
    return out


@pytest.fixture(scope="module")
def netbox(edge):
    """One default (`network: none`) sandbox for the read-only probes of this module."""
    c = edge.client()
    sid = c.create({"labels": {"suite": "security-network"}})["id"]
    assert c.get(f"/v1/sandboxes/{sid}", expect=200).json["network"]["mode"] == "none"
    yield c, sid
    c.remove(sid)
    c.close()


def test_only_loopback_interface_and_no_routes(netbox, figure):
    """Inside a `none` sandbox the only interface is `lo` (/proc/net/dev, ip link) and there is
    no route but loopback (/proc/net/route empty, every IPv6 route on lo, no default route)."""
    c, sid = netbox
    dev = c.sh(sid, "cat /proc/net/dev")
    ifaces = sorted(line.split(":")[0].strip() for line in dev.splitlines()[2:] if ":" in line)
    figure("interfaces", ",".join(ifaces))
    assert ifaces == ["lo"], dev
    r = c.exec(sid, "ls /sys/class/net 2>/dev/null")
    assert r["stdout"].split() in ([], ["lo"]), r
    route = c.sh(sid, "cat /proc/net/route").splitlines()
    assert len(route) <= 1, f"IPv4 routes inside a none sandbox: {route}"
    v6 = c.exec(sid, "cat /proc/net/ipv6_route 2>/dev/null")["stdout"].splitlines()
    assert all(line.split()[-1] == "lo" for line in v6), v6
    if c.exec(sid, "test -x /usr/sbin/ip")["exit_code"] == 0:
        links = c.sh(sid, "/usr/sbin/ip -o link show")
        names = sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines())
        assert names == ["lo"], links
        routes = c.sh(sid, "/usr/sbin/ip route show table all")
        assert "default" not in routes, routes
        for line in routes.splitlines():
            assert " dev lo" in line, f"a route off loopback: {line}"
        figure("routes (all tables)", len(routes.splitlines()))


def test_no_route_to_private_public_or_host_addresses(netbox, figure):
    """TCP connects and UDP sends to 10/8, 172.16/12, 192.168/16, 169.254.169.254, public
    addresses (v4 and v6) and every address of the host itself all fail ENETUNREACH."""
    c, sid = netbox
    targets = [["inet", h, 80, "tcp"] for h in
               ("10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254", "8.8.8.8",
                "1.1.1.1")]
    targets += [["inet", "8.8.8.8", 53, "udp"], ["inet", "10.0.0.1", 53, "udp"],
                ["inet6", "2001:4860:4860::8888", 53, "tcp"],
                ["inet6", "2001:4860:4860::8888", 53, "udp"], ["inet6", "fd00::1", 80, "tcp"]]
    hosts = host_addresses()
    figure("host addresses tried", len(hosts))
    for fam, addr in hosts:
        for port in (22, 80, 443):
            targets.append([fam, addr, port, "tcp"])
        targets.append([fam, addr, 53, "udp"])
    got = connect_from(c, sid, targets)
    bad = {k: v for k, v in got.items() if v != "ENETUNREACH"}
    assert not bad, f"reachable or not ENETUNREACH from a none sandbox: {bad}"
    figure("targets refused ENETUNREACH", len(got))


def test_edge_tcp_port_unreachable_from_inside(edge, netbox, figure):
    """The edge's TCP port (open on the host's 127.0.0.1) is ECONNREFUSED on the sandbox's own
    loopback (v4 and v6) and ENETUNREACH on every host address."""
    c, sid = netbox
    with socket.create_connection(("127.0.0.1", edge.port), timeout=5):
        pass  # reachable from the host
    targets = [["inet", "127.0.0.1", edge.port, "tcp"], ["inet", "127.1.2.3", edge.port, "tcp"],
               ["inet6", "::1", edge.port, "tcp"]]
    targets += [[fam, a, edge.port, "tcp"] for fam, a in host_addresses()]
    got = connect_from(c, sid, targets)
    for t in targets:
        want = "ECONNREFUSED" if t[1] in ("127.0.0.1", "127.1.2.3", "::1") else "ENETUNREACH"
        assert got[key(t)] == want, got
    # And the HTTP API itself does not answer there.
    r = c.exec(sid, cmd=["python3", "-c",
                         "import urllib.request,sys\n"
                         f"urllib.request.urlopen('http://127.0.0.1:{edge.port}/v1/health', "
                         "timeout=3)"])
    assert r["exit_code"] != 0 and "Connection refused" in r["stderr"], r


class HostListeners:
    """TCP listeners on the host's 127.0.0.1 and 0.0.0.0, a UDP socket on 127.0.0.1 and an
    abstract unix socket, each checked reachable from the host."""

    def __init__(self):
        self.socks = []
        self.tcp_lo = self._tcp("127.0.0.1")
        self.tcp_any = self._tcp("0.0.0.0")
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.udp.setblocking(False)
        self.socks.append(self.udp)
        self.abstract = "@dsec-sec-" + secrets.token_hex(6)
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind("\0" + self.abstract[1:])
        self.unix.listen(16)
        self.unix.setblocking(False)
        self.socks.append(self.unix)
        # Positive controls: each is reachable from the host.
        for s in (self.tcp_lo, self.tcp_any):
            socket.create_connection(s.getsockname()[:2], timeout=5).close()
            s.accept()[0].close()
        u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        u.connect("\0" + self.abstract[1:])
        u.close()
        self.unix.accept()[0].close()

    def _tcp(self, addr):
        s = socket.socket()
        s.bind((addr, 0))
        s.listen(16)
        s.settimeout(5)
        self.socks.append(s)
        return s

    def accepted_anything(self):
        got = []
        for s in (self.tcp_lo, self.tcp_any, self.unix):
            s.setblocking(False)
            try:
                c, _ = s.accept()
                c.close()
                got.append(s.getsockname())
            except BlockingIOError:
                pass
        try:
            self.udp.recv(100)
            got.append("udp")
        except BlockingIOError:
            pass
        return got

    def close(self):
        for s in self.socks:
            s.close()


@pytest.fixture
def host_listeners():
    h = HostListeners()
    yield h
    h.close()


def test_host_services_unreachable(netbox, host_listeners, figure):
    """Listeners on the host's 127.0.0.1 and 0.0.0.0 (TCP, UDP) and a host abstract unix socket
    cannot be reached from inside: ECONNREFUSED / ENETUNREACH, and the host side sees nothing."""
    c, sid = netbox
    h = host_listeners
    lo_port, any_port = h.tcp_lo.getsockname()[1], h.tcp_any.getsockname()[1]
    udp_port = h.udp.getsockname()[1]
    targets = [["inet", "127.0.0.1", lo_port, "tcp"], ["inet", "127.0.0.1", any_port, "tcp"],
               ["inet", "127.0.0.1", udp_port, "udp"], ["unix", h.abstract, 0, "tcp"]]
    hosts = host_addresses()
    targets += [[fam, a, any_port, "tcp"] for fam, a in hosts]
    got = connect_from(c, sid, targets)
    assert got[key(targets[0])] == "ECONNREFUSED", got
    assert got[key(targets[1])] == "ECONNREFUSED", got
    # UDP to a closed loopback port: the local send succeeds, but nothing arrives on the host.
    assert got[key(targets[2])] in ("sent", "ECONNREFUSED"), got
    assert got[key(targets[3])] == "ECONNREFUSED", got
    for t in targets[4:]:
        assert got[key(t)] == "ENETUNREACH", got
    # The host's abstract socket is not even listed inside.
    assert h.abstract not in c.sh(sid, "cat /proc/net/unix")
    assert h.accepted_anything() == [], "a host listener received something from the sandbox"
    figure("host listeners tried", len(targets))


def test_edge_unix_socket_not_visible_or_connectable(edge, netbox, figure):
    """The edge's unix socket path (and its state dir) do not exist inside the sandbox, connect
    gives ENOENT, and no socket of the host shows in the sandbox's /proc/net/unix."""
    c, sid = netbox
    assert edge.unix_client().get("/v1/health", validate=False).status == 200  # host side
    code = ("import os, sys\n"
            "for p in sys.argv[1:]:\n"
            "    try:\n"
            "        os.stat(p); print(p, 'exists')\n"
            "    except OSError as e:\n"
            "        print(p, e.errno)\n")
    paths = [edge.socket, str(edge.state_dir), str(edge.root), str(edge.token_file)]
    r = c.exec(sid, cmd=["python3", "-c", code, *paths])
    for line in r["stdout"].splitlines():
        p, verdict = line.rsplit(" ", 1)
        assert verdict == "2", f"{p} visible inside the sandbox: {line}"  # ENOENT
    got = connect_from(c, sid, [["unix", edge.socket, 0, "tcp"],
                                ["unix", "@" + edge.socket, 0, "tcp"]])
    assert got[f"tcp:{edge.socket}:0"] == "ENOENT", got
    assert got[f"tcp:@{edge.socket}:0"] == "ECONNREFUSED", got
    unix = c.sh(sid, "cat /proc/net/unix")
    assert edge.socket not in unix and str(edge.root) not in unix, unix
    host_unix = open("/proc/net/unix").read()
    assert edge.socket in host_unix  # the host lists it: the inside view is really separate
    figure("unix sockets listed inside", len(unix.splitlines()) - 1)


LISTEN = r"""
import socket, sys, time
port, name = int(sys.argv[1]), sys.argv[2]
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("0.0.0.0", port)); t.listen(16)
u = socket.socket(socket.AF_UNIX); u.bind("\0" + name); u.listen(16)
open("/tmp/listening", "w").close()
time.sleep(600)
"""


def test_other_sandbox_listener_unreachable(edge, netbox, figure):
    """A TCP port and an abstract unix socket that another sandbox listens on (and reaches
    itself) are ECONNREFUSED from this sandbox: each sandbox's loopback is its own."""
    c, sid = netbox
    other = c.create({"labels": {"suite": "security-network"}})["id"]
    try:
        port, name = 20000 + secrets.randbelow(20000), "dsec-sb-" + secrets.token_hex(6)
        c.post(f"/v1/sandboxes/{other}/exec",
               {"cmd": ["python3", "-c", LISTEN, str(port), name], "background": True},
               expect=202)
        wait_until(lambda: c.exec(other, "test -e /tmp/listening")["exit_code"] == 0, 20,
                   what="the other sandbox listening")
        targets = [["inet", "127.0.0.1", port, "tcp"], ["unix", "@" + name, 0, "tcp"]]
        own = connect_from(c, other, targets)
        assert set(own.values()) == {"connected"}, own  # positive control, in its own sandbox
        got = connect_from(c, sid, targets)
        assert got == {key(t): "ECONNREFUSED" for t in targets}, got
        figure("other sandbox targets refused", len(got))
    finally:
        c.remove(other)


RAW = r"""
import errno, json, socket
out = {}
def name(e):
    return errno.errorcode.get(e.errno, repr(e))
tries = {
    "packet_raw": (socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)),
    "packet_dgram": (socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(3)),
    "inet_raw_icmp": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    "inet_raw_raw": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW),
    "inet6_raw_icmp": (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
    "inet_ping": (socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP),
}
for k, args in tries.items():
    try:
        s = socket.socket(*args)
    except OSError as e:
        out[k] = "blocked " + name(e)
        continue
    try:
        if args[0] == socket.AF_PACKET:
            s.bind(("eth0", 3))
            out[k] = "bound eth0"
        else:
            dst = "2001:4860:4860::8888" if args[0] == socket.AF_INET6 else "8.8.8.8"
            s.sendto(b"\x08\x00\xf7\xff\x00\x00\x00\x00", (dst, 0))
            out[k] = "sent"
    except OSError as e:
        out[k] = "opened, then " + name(e)
print(json.dumps(out))
"""


def test_raw_packet_sockets_and_netlink_changes_gain_nothing(netbox, figure):
    """Raw, packet and ping sockets are refused or reach nothing (EPERM / ENETUNREACH / ENODEV),
    and adding links, addresses or routes or downing lo fails with the routes unchanged."""
    c, sid = netbox
    r = c.exec(sid, cmd=["python3", "-c", RAW])
    got = json.loads(r["stdout"])
    for k, v in got.items():
        figure(k, v)
    ok = ("blocked EPERM", "blocked EACCES", "blocked EAFNOSUPPORT", "blocked EPROTONOSUPPORT",
          "blocked ENOSYS",
          "opened, then ENETUNREACH", "opened, then ENODEV")
    bad = {k: v for k, v in got.items() if v not in ok}
    assert not bad, f"raw/packet sockets gained something: {bad}"
    before = c.sh(sid, "cat /proc/net/route /proc/net/ipv6_route /proc/net/dev | cut -c1-40")
    if c.exec(sid, "test -x /usr/sbin/ip")["exit_code"] != 0:
        pytest.skip("no ip(8) in the host image to try netlink changes with")
    for cmd in ("link add dsec0 type dummy", "addr add 10.9.9.9/24 dev lo",
                "route add default dev lo", "route add 10.0.0.0/8 dev lo", "link set lo down"):
        r = c.exec(sid, f"/usr/sbin/ip {cmd}")
        assert r["exit_code"] != 0, f"ip {cmd} succeeded inside the sandbox: {r}"
        assert "Operation not permitted" in r["stderr"] or "denied" in r["stderr"], r
    after = c.sh(sid, "cat /proc/net/route /proc/net/ipv6_route /proc/net/dev | cut -c1-40")
    assert after == before
    assert "UP" in c.sh(sid, "/usr/sbin/ip -o link show lo")
    # Loopback still works inside (the sandbox's own services are fine).
    code = ("import socket\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
            "socket.create_connection(s.getsockname()).close(); print('ok')")
    assert c.exec(sid, cmd=["python3", "-c", code])["stdout"] == "ok\n"
