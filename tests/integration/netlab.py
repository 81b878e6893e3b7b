"""A private "internet" for network tests: no packet ever leaves this machine.

    with NetLab() as lab:          # two network namespaces, joined by a veth
        edge = Edge.start(netns=lab.node)   # the edge's uplink is the veth into lab.internet

- `lab.node` ("dsit-node-<pid>"): where the test edge runs; its only route out (the default)
  goes to the internet namespace. Its loopback holds the edge's TCP API.
- `lab.internet`: 203.0.113.2 on the link; "public" servers on 198.51.100.10 (HTTP on 80 and
  8080, a TCP echo on 7) and a "private" one on 10.9.9.9 (HTTP on 80); a DNS server on
  198.51.100.53 (NAMES below; NXDOMAIN for the rest).
Everything goes with the namespaces (servers are killed first).
"""

import json
import os
import shutil
import subprocess
import sys
import time

PUBLIC = "198.51.100.10"
DNS = "198.51.100.53"
NAMES = {"pypi.test": PUBLIC, "files.hosted.test": PUBLIC, "unlisted.test": PUBLIC,
         "internal.test": "10.9.9.9"}
PRIVATE = "10.9.9.9"
UPLINK_ADDR = "203.0.113.1"

# Connects from inside a sandbox: prints "ok" or the error's class and errno, and the time.
PROBE = r"""
import socket, sys, time
t = time.monotonic()
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    r = "ok"
except OSError as e:
    r = f"{type(e).__name__} {e.errno}"
print(r, round((time.monotonic() - t) * 1000))
"""

ECHO = r"""
import socketserver, sys
class H(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            d = self.request.recv(65536)
            if not d:
                return
            self.request.sendall(d)
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer.daemon_threads = True
socketserver.ThreadingTCPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"""


RESOLVER = r"""
import json, socket, struct, sys
names = json.loads(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 53))
while True:
    q, peer = s.recvfrom(512)
    i, labels = 12, []
    while q[i]:
        labels.append(q[i + 1:i + 1 + q[i]].decode().lower())
        i += 1 + q[i]
    qtype = struct.unpack(">H", q[i + 1:i + 3])[0]
    addr = names.get(".".join(labels))
    head = q[:2] + struct.pack(">HHHHH", 0x8180 if addr else 0x8183, 1,
                               1 if addr and qtype == 1 else 0, 0, 0)
    r = head + q[12:i + 5]
    if addr and qtype == 1:
        r += b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 300, 4) + socket.inet_aton(addr)
    s.sendto(r, peer)
"""


def why_not_available():
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "nsenter", "nft"):
        if not shutil.which(tool):
            return f"needs {tool} (scripts/install-deps installs it)"
    return None


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


class NetLab:
    def __init__(self, tag=None):
        tag = tag or str(os.getpid())
        self.node = f"dsit-node-{tag}"
        self.internet = f"dsit-inet-{tag}"
        self.procs = []

    def __enter__(self):
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def ns(self, name, *cmd, check=True):
        return sh("ip", "netns", "exec", name, *cmd, check=check)

    def _build(self):
        for n in (self.node, self.internet):
            sh("ip", "netns", "add", n)
        n, i = self.node, self.internet
        sh("ip", "-n", n, "link", "set", "lo", "up")
        sh("ip", "-n", i, "link", "set", "lo", "up")
        sh("ip", "-n", n, "link", "add", "up0", "type", "veth", "peer", "name", "wan0", "netns", i)
        sh("ip", "-n", n, "addr", "add", f"{UPLINK_ADDR}/24", "dev", "up0")
        sh("ip", "-n", n, "link", "set", "up0", "up")
        sh("ip", "-n", n, "route", "add", "default", "via", "203.0.113.2")
        sh("ip", "-n", i, "addr", "add", "203.0.113.2/24", "dev", "wan0")
        sh("ip", "-n", i, "link", "set", "wan0", "up")
        for a in (PUBLIC, PRIVATE, DNS):
            sh("ip", "-n", i, "addr", "add", f"{a}/32", "dev", "lo")
        self.serve_http(PUBLIC, 80)
        self.serve_http(PUBLIC, 8080)
        self.serve_http(PRIVATE, 80)
        self.spawn(self.internet, [sys.executable, "-c", ECHO, PUBLIC, "7"], (PUBLIC, 7))
        self.spawn(self.internet, [sys.executable, "-c", RESOLVER, DNS, json.dumps(NAMES)])
        ask = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
               "s.settimeout(0.2); s.sendto(bytes.fromhex('123401000001000000000000') + "
               f"b'\\x04pypi\\x04test\\x00\\x00\\x01\\x00\\x01', ('{DNS}', 53)); s.recv(512)")
        deadline = time.monotonic() + 10
        while self.ns(self.internet, sys.executable, "-c", ask, check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the test resolver did not start")
            time.sleep(0.05)

    def serve_http(self, addr, port):
        self.spawn(self.internet, [sys.executable, "-m", "http.server", "--bind", addr, str(port)],
                   (addr, port))

    def spawn(self, ns, cmd, wait_for=None):
        p = subprocess.Popen(["ip", "netns", "exec", ns] + cmd, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        if wait_for:
            addr, port = wait_for
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                r = self.ns(ns, sys.executable, "-c",
                            f"import socket; socket.create_connection(('{addr}', {port}), 1)",
                            check=False)
                if r.returncode == 0:
                    return p
                time.sleep(0.05)
            raise RuntimeError(f"test server {addr}:{port} did not start")
        return p

    def links(self):
        """Interface names in the node namespace."""
        out = sh("ip", "-n", self.node, "-o", "link").stdout
        return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]

    def ruleset(self):
        return self.ns(self.node, "nft", "list", "ruleset").stdout

    def conntrack(self):
        r = self.ns(self.node, "cat", "/proc/net/nf_conntrack", check=False)
        return r.stdout if r.returncode == 0 else ""

    def sysctl(self, path):
        return self.ns(self.node, "cat", f"/proc/sys/{path}").stdout.strip()

    def close(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
            p.wait()
        for n in (self.node, self.internet):
            sh("ip", "netns", "del", n, check=False)
