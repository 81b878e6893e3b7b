#!/usr/bin/env python3
"""Sandbox networking benchmark (issue 17), side by side in one run, through dsec-edge's REST
API, on an edge in a network namespace of its own whose uplink is a veth into a private test
internet (tests/integration/netlab.py): no packet leaves the machine.

 create   POST /v1/sandboxes with network none against allowlist (one CIDR rule), interleaved,
          each deleted right after and 0.2 s left for the kernel's namespace teardown (the
          allowlist one: a veth into its namespace, addresses, routes, its nftables chain and
          set elements, before the agent starts)
 patch    PATCH /v1/sandboxes/{id} {"network": ...} alternating two policies: the time until the
          call returns, which is when the rules are in force (checked: every 10th change is
          followed by a connection from inside that must see it)
 proxy    a 256 MiB download from a server in the sandbox: through the port proxy (TCP to the
          edge's API port, from its namespace) against a direct connection from inside the
          sandbox's namespace; MB/s, best of 3 each
 microvm  (where the edge serves microVMs) creates of a busybox microVM with network none
          against allowlist (a tap on the node, the guest configuring its NIC at setup),
          interleaved, from the same kind of template each; and a 64 MiB download from busybox
          httpd in a VM through the port proxy, which its agent relays (port_connect)

    sudo python3 bench/network_bench.py [--creates 40] [--patches 200] [--json] [--no-microvm]
                                        [--edge PATH]   (another build's dsec-edge: an A/B)

Leaves nothing behind (residue checked after SIGTERM); exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
sys.path.insert(0, os.path.join(REPO, "examples"))
import edge_harness  # noqa: E402
import edgeproc  # noqa: E402
import netlab  # noqa: E402

pct = edgeproc.percentile
JSON_OUT = False

SERVE = r"""
import http.server
CHUNK = b"\0" * (1 << 20)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        n = 256
        self.send_response(200); self.send_header("Content-Length", str(n << 20)); self.end_headers()
        for _ in range(n):
            self.wfile.write(CHUNK)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", 9000), H).serve_forever()
"""

FETCH = r"""
import http.client, sys, time
host, port, path, token = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
c = http.client.HTTPConnection(host, port, timeout=60)
t = time.perf_counter()
c.request("GET", path, headers={"Authorization": "Bearer " + token} if token else {})
r = c.getresponse()
n = 0
while True:
    b = r.read(1 << 20)
    if not b:
        break
    n += len(b)
print(r.status, n, time.perf_counter() - t)
"""


CONNECTS = r"""
import json, socket, sys, time
host, port, blocked = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ok, refused, how = [], [], ""
for i in range(300):  # 100 a second: under the sandbox's new-connection cap (200/s)
    time.sleep(0.01)
    s = socket.socket(); t = time.perf_counter()
    s.connect((host, port)); ok.append((time.perf_counter() - t) * 1e6); s.close()
    s = socket.socket(); t = time.perf_counter()
    try:
        s.connect((blocked, 80))
    except OSError as e:
        how = type(e).__name__
    refused.append((time.perf_counter() - t) * 1e6); s.close()
print(json.dumps({"ok": ok[50:], "refused": refused[50:], "refusal": how}))
"""


def emit(rec: dict) -> None:
    rec = {"workload": "network", **rec}
    if JSON_OUT:
        print("JSON " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                    for k, v in rec.items()}), flush=True)


def row(name: str, xs: list[float], unit: str = "ms") -> str:
    return (f"| {name} | {len(xs)} | {pct(xs, 50):.2f} | {pct(xs, 90):.2f} | {pct(xs, 99):.2f} "
            f"| {unit} |")


def timed(fn):
    t = time.perf_counter()
    r = fn()
    return r, (time.perf_counter() - t) * 1e3


def vm_rows(c, edge, lab, creates: int, allow: dict) -> None:
    """The microVM kind's rows (skipped, with the reason, where the edge has none)."""
    import microvm_bench  # (bench/) its busybox image
    vm = c.get("/v1/node").json["features"].get("microvm", {})
    if not vm.get("available"):
        print(f"| microVM rows skipped: {vm.get('reason', 'no microVMs')} | | | | | |")
        return
    tar = microvm_bench.busybox_tar(microvm_bench.APPLETS + ["httpd", "mkdir", "dd"])
    r = c.post("/v1/images/import?name=bench-vm-net:1&format=rootfs", tar,
               headers={"Content-Type": "application/octet-stream"})
    assert r.status == 201, r
    body = {"kind": "microvm", "image": "bench-vm-net:1", "memory_mb": 128, "disk_mb": 96}
    for net in ({"mode": "none"}, allow):  # the two templates
        r = c.post("/v1/sandboxes", {**body, "network": net})
        assert r.status == 201, r
        c.delete(f"/v1/sandboxes/{r.json['id']}")
    times = {"none": [], "allowlist": []}
    n = max(4, min(creates, 12))
    for i in range(n * 2):
        kind = "none" if i % 2 == 0 else "allowlist"
        net = {"mode": "none"} if kind == "none" else allow
        r, ms = timed(lambda: c.post("/v1/sandboxes", {**body, "network": net}))
        assert r.status == 201, r
        times[kind].append(ms)
        c.delete(f"/v1/sandboxes/{r.json['id']}")
        time.sleep(0.2)
    print(row("microVM create, network none", times["none"]))
    print(row("microVM create, network allowlist (a tap)", times["allowlist"]))
    emit({"case": "vm_create_none", "p50_ms": pct(times["none"], 50)})
    emit({"case": "vm_create_allowlist", "p50_ms": pct(times["allowlist"], 50),
          "added_p50_ms": pct(times["allowlist"], 50) - pct(times["none"], 50)})
    sid = c.post("/v1/sandboxes", body).json["id"]
    try:
        out = c.post(f"/v1/sandboxes/{sid}/exec", {"shell": (
            "mkdir -p /tmp/www && dd if=/dev/zero of=/tmp/www/big bs=1M count=64 2>/dev/null && "
            "httpd -p 127.0.0.1:9000 -h /tmp/www")}).json
        assert out["exit_code"] == 0, out
        time.sleep(0.5)
        rates = []
        for _ in range(3):
            done = subprocess.run(
                ["nsenter", f"--net=/run/netns/{lab.node}", sys.executable, "-c", FETCH,
                 "127.0.0.1", str(edge.port), f"/v1/sandboxes/{sid}/ports/9000/big", edge.token],
                capture_output=True, text=True, timeout=300)
            status, nbytes, secs = done.stdout.split()
            assert status == "200" and int(nbytes) == 64 << 20, done
            rates.append(int(nbytes) / float(secs) / 1e6)
        print(f"| microVM: download 64 MiB through the port proxy (agent relay) | 3 | "
              f"best {max(rates):.0f} | | | MB/s |")
        emit({"case": "vm_proxy", "proxy_mb_s": max(rates)})
    finally:
        c.delete(f"/v1/sandboxes/{sid}")
        c.delete("/v1/images/bench-vm-net:1")


def main() -> int:
    global JSON_OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=40)
    ap.add_argument("--patches", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--edge", default=None)
    ap.add_argument("--no-microvm", action="store_true", help="skip the microVM rows")
    a = ap.parse_args()
    JSON_OUT = a.json
    why = edge_harness.why_not_runnable() or netlab.why_not_available()
    if why:
        print(f"network_bench: skipped: {why}")
        return 0
    ok = True
    with netlab.NetLab("bench") as lab:
        edge = edge_harness.Edge.start(netns=lab.node, binary=a.edge)
        try:
            c = edge.client(validate=False, timeout=120)
            allow = {"mode": "allowlist", "rules": [{"cidr": netlab.PUBLIC, "ports": "80"}]}
            # Warm up both paths (the node network starts at the first networked create).
            for net in ({"mode": "none"}, allow):
                sid = c.post("/v1/sandboxes", {"network": net}).json["id"]
                c.delete(f"/v1/sandboxes/{sid}")
            times = {"none": [], "allowlist": []}
            for i in range(a.creates * 2):
                kind = "none" if i % 2 == 0 else "allowlist"
                net = {"mode": "none"} if kind == "none" else allow
                r, ms = timed(lambda: c.post("/v1/sandboxes", {"network": net}))
                assert r.status == 201, r
                times[kind].append(ms)
                c.delete(f"/v1/sandboxes/{r.json['id']}")
                # The kernel tears a network namespace down in the background (a veth's
                # removal waits for RCU under the rtnl lock): let it finish, so that no create
                # is measured against the previous delete's teardown.
                time.sleep(0.2)
            added = pct(times["allowlist"], 50) - pct(times["none"], 50)
            print("| what | n | p50 | p90 | p99 | unit |\n|---|---|---|---|---|---|")
            print(row("create, network none", times["none"]))
            print(row("create, network allowlist (1 rule)", times["allowlist"]))
            emit({"case": "create_none", "p50_ms": pct(times["none"], 50)})
            emit({"case": "create_allowlist", "p50_ms": pct(times["allowlist"], 50),
                  "added_p50_ms": added})

            sid = c.post("/v1/sandboxes", {"network": allow}).json["id"]
            other = {"mode": "allowlist", "rules": [{"cidr": netlab.PUBLIC, "ports": "8080"}]}
            probe = ("import socket,sys\ntry:\n socket.create_connection(('%s',%s),2); print('ok')\n"
                     "except OSError: print('no')")
            patch_ms = []
            for i in range(a.patches):
                pol = other if i % 2 == 0 else allow
                r, ms = timed(lambda: c.patch(f"/v1/sandboxes/{sid}", {"network": pol}))
                assert r.status == 200, r
                patch_ms.append(ms)
                if i % 10 == 0:  # in force when the PATCH returned
                    port = 8080 if pol is other else 80
                    for p, want in ((port, "ok"), (80 if port == 8080 else 8080, "no")):
                        out = c.post(f"/v1/sandboxes/{sid}/exec", {
                            "cmd": ["python3", "-c", probe % (netlab.PUBLIC, p)]}).json
                        if out["stdout"].strip() != want:
                            print(f"network_bench: policy not in force after PATCH: {out}")
                            ok = False
            print(row("PATCH network (until enforced)", patch_ms))
            emit({"case": "patch", "p50_ms": pct(patch_ms, 50), "p99_ms": pct(patch_ms, 99)})

            # connect() from inside: to an allowed server, and refused (the metadata address:
            # by the egress guard at connect, or by nftables' reset where there is none).
            c.patch(f"/v1/sandboxes/{sid}", {"network": allow})
            out = c.post(f"/v1/sandboxes/{sid}/exec", {
                "cmd": ["python3", "-c", CONNECTS, netlab.PUBLIC, "80", "169.254.169.254"]},
                timeout=120).json
            res = json.loads(out["stdout"])
            print(row("TCP connect to an allowed server (from the sandbox)", res["ok"], "us"))
            print(row(f"TCP connect refused, metadata address ({res['refusal']})",
                      res["refused"], "us"))
            emit({"case": "connect", "p50_us": pct(res["ok"], 50),
                  "refused_p50_us": pct(res["refused"], 50), "refusal": res["refusal"]})

            c.post(f"/v1/sandboxes/{sid}/exec", {
                "cmd": ["sh", "-c", "python3 -c \"$0\" >/dev/null 2>&1 &", SERVE]})
            time.sleep(1.0)
            pid = edge.sandbox_pids(sid)[0]

            def fetch(prefix: list[str], host: str, port: int, path: str, token: str) -> float:
                out = subprocess.run(prefix + [sys.executable, "-c", FETCH, host, str(port), path,
                                               token], capture_output=True, text=True, timeout=120)
                status, n, secs = out.stdout.split()
                assert status == "200" and int(n) == 256 << 20, out
                return int(n) / float(secs) / 1e6

            def cpu() -> tuple[float, float]:
                """(busy CPU seconds of the whole host, CPU seconds of the edge)."""
                tick = os.sysconf("SC_CLK_TCK")
                f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
                busy = (sum(f) - f[3] - f[4]) / tick  # all but idle and iowait
                st = open(f"/proc/{edge.proc.pid}/stat").read().rsplit(")", 1)[1].split()
                return busy, (int(st[11]) + int(st[12])) / tick

            c0 = cpu()
            direct = [fetch(["nsenter", f"--net=/proc/{pid}/ns/net"], "127.0.0.1", 9000, "/", "")
                      for _ in range(3)]
            c1 = cpu()
            proxied = [fetch(["nsenter", f"--net=/run/netns/{lab.node}"], "127.0.0.1", edge.port,
                             f"/v1/sandboxes/{sid}/ports/9000/", edge.token) for _ in range(3)]
            c2 = cpu()
            ratio = max(proxied) / max(direct)
            gib = 3 * 256 / 1024
            # Both are CPU-bound here: what each byte costs the host's 2 cores, and the relay's part.
            print(f"| CPU per GiB: direct {(c1[0] - c0[0]) / gib:.2f} s, through the proxy "
                  f"{(c2[0] - c1[0]) / gib:.2f} s, of it the edge's relay "
                  f"{(c2[1] - c1[1]) / gib:.2f} s | | | | | |")
            print(f"| download 256 MiB, direct in its namespace | 3 | best {max(direct):.0f} | "
                  f"| | MB/s |")
            print(f"| download 256 MiB, through the port proxy | 3 | best {max(proxied):.0f} | "
                  f"| | MB/s ({ratio * 100:.0f}% of direct) |")
            emit({"case": "proxy", "direct_mb_s": max(direct), "proxy_mb_s": max(proxied),
                  "ratio": ratio})
            if not a.no_microvm:
                vm_rows(c, edge, lab, a.creates, allow)
            print(f"\ntargets: create with allowlist adds {added:.2f} ms at p50 (<= 1.5), "
                  f"PATCH p50 {pct(patch_ms, 50):.2f} ms (<= 5), proxy {ratio * 100:.0f}% of "
                  f"direct (>= 80)")
            c.delete(f"/v1/sandboxes/{sid}")
        finally:
            residue = edge.shutdown_and_check()
            edge.cleanup()
        if residue:
            print(f"network_bench: residue: {residue}")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
