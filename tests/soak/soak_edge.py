#!/usr/bin/python3
"""Soak test for dsec-edge: N sandboxes created, exec'd once and deleted through the REST API
by C concurrent clients; the host must be back to its baseline afterwards.

    tests/soak/soak_edge.py [--sandboxes 2000] [--clients 16] [--edge PATH]

Starts its own dsec-edge (127.0.0.1, free port, temp state dir/token/socket; binary from
--edge, DSEC_EDGE_BIN, or build/release/src/edge/dsec-edge). Before and after the run it
counts:

  processes   host processes that belong to the edge's sandboxes (in its cgroups, rooted in its
              state dir, or descended from the edge) - the host-wide total is printed too, but
              other work on the machine moves it, so it is not compared
  threads     threads of the edge process
  mounts      mounts in /proc/self/mountinfo under the state dir (the host-wide total is
              printed too)
  cgroups     directories under dsec-<instance> in every cgroup hierarchy
  edge_fds    entries of /proc/<edge>/fd, except the idle network namespaces the backend keeps
              for reuse (netns_pool: bounded by the peak concurrency, checked separately)
  state_dir   entries under the state dir (recursively; the audit log and the sqlite files are
              there from the start)
  loop_devs   attached loop devices on the host
  netns       network namespaces of the edge's sandboxes (the idle ones the backend keeps for
              reuse are counted apart, as netns_pool, and bounded by the peak concurrency)
  edge_rss    the edge's resident memory: the allocator keeps what the first sandboxes used, so
              it is compared between the end of the first half of the run and the end (at most
              4 MiB more), not against the idle baseline

and fails (exit 1) if any compared figure is not back to baseline within a deadline (teardown is
asynchronous), if any request failed, or if the edge leaves residue after SIGTERM. Prints the
figures and the create/exec/delete latencies. Needs root; exits 77 (skip) otherwise.
"""

import argparse
import os
import pathlib
import re
import sys
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

import edge_harness  # noqa: E402
from edge_harness import Edge  # noqa: E402

SKIP = 77


def descendants(pid):
    children = {}
    for p in edge_harness.pids():
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def fd_targets(pid):
    out = []
    for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
        try:
            out.append(f"{fd} -> {os.readlink(f'/proc/{pid}/fd/{fd}')}")
        except OSError:
            pass
    return out


def count_entries(path):
    n = 0
    for _, dirs, files in os.walk(path):
        n += len(dirs) + len(files)
    return n


def loop_devices():
    n = 0
    for dev in os.listdir("/sys/block"):
        if dev.startswith("loop") and os.path.exists(f"/sys/block/{dev}/loop/backing_file"):
            n += 1
    return n


def net_namespaces(pids):
    seen = set()
    for p in pids:
        try:
            seen.add(os.stat(f"/proc/{p}/ns/net").st_ino)
        except OSError:
            pass
    return len(seen)


def edge_rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def figures(edge):
    own = set(edge.processes()) | set(descendants(edge.pid))
    try:
        threads = len(os.listdir(f"/proc/{edge.pid}/task"))
        targets = [t.split(" -> ", 1)[1] for t in fd_targets(edge.pid)]
    except OSError:
        threads, targets = -1, []
    # The backend keeps idle loopback-only network namespaces for reuse (NetnsPool: the ns fd
    # plus its sockstat/sockstat6 files); the pool grows to the peak number of concurrent
    # sandboxes. Counted apart, and bounded separately.
    pool = [t for t in targets if t.startswith("net:[")
            or re.fullmatch(r"/proc/\d+/task/\d+/net/sockstat6?", t)]
    netns = sum(1 for t in pool if t.startswith("net:["))
    fds = len(targets) - len(pool)
    return {
        "processes": len(own),
        "threads": threads,
        "mounts": len(edge.mounts()),
        "cgroups": len(edge.cgroup_dirs()),
        "edge_fds": fds,
        "netns_pool": netns,
        "state_dir": count_entries(edge.state_dir),
        "loop_devs": loop_devices(),
        "netns": net_namespaces(own),
        "edge_rss_kb": edge_rss_kb(edge.pid),
        # Informational: other work on the host moves these.
        "host_processes": len(edge_harness.pids()),
        "host_mounts": len(edge_harness.mountinfo()),
    }


COMPARED = ("processes", "mounts", "cgroups", "edge_fds", "state_dir", "loop_devs", "netns")
RSS_SLACK_KB = 4096


def pct(sorted_ms, p):
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, int(p / 100 * len(sorted_ms)))]


def run(edge, total, clients):
    lock = threading.Lock()
    state = {"next": 0, "done": 0, "errors": []}
    lat = {"create": [], "exec": [], "delete": []}
    t_start = time.monotonic()

    def worker():
        c = edge.client(keep_alive=True, validate=False)
        try:
            while True:
                with lock:
                    if state["next"] >= total or len(state["errors"]) > 20:
                        return
                    i = state["next"]
                    state["next"] += 1
                try:
                    t0 = time.monotonic()
                    # (a small disk: the host frees a deleted sandbox's preallocated image
                    # only as fast as it discards its blocks; 256 MiB images at this rate
                    # held ~60 GB of this host's disk at the peak)
                    r = c.post("/v1/sandboxes", {"memory_mb": 64, "disk_mb": 32, "ttl_s": 600,
                                                 "labels": {"soak": "1"}})
                    t1 = time.monotonic()
                    if r.status != 201:
                        raise AssertionError(f"create: {r!r}")
                    sid = r.json["id"]
                    try:
                        r = c.post(f"/v1/sandboxes/{sid}/exec", {"cmd": ["echo", str(i)]})
                        t2 = time.monotonic()
                        if r.status != 200 or r.json.get("stdout") != f"{i}\n":
                            raise AssertionError(f"exec: {r!r}")
                    finally:
                        t2 = time.monotonic()
                        r = c.delete(f"/v1/sandboxes/{sid}")
                        t3 = time.monotonic()
                        if r.status != 204:
                            raise AssertionError(f"delete: {r!r}")
                    with lock:
                        lat["create"].append((t1 - t0) * 1000)
                        lat["exec"].append((t2 - t1) * 1000)
                        lat["delete"].append((t3 - t2) * 1000)
                        state["done"] += 1
                except Exception as e:  # noqa: BLE001 -- counted and reported
                    with lock:
                        state["errors"].append(repr(e)[:300])
        finally:
            c.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    last = 0.0
    while any(t.is_alive() for t in threads):
        time.sleep(0.2)
        if sys.stdout.isatty() and time.monotonic() - last > 0.5:
            last = time.monotonic()
            el = last - t_start
            print(f"\r  {state['done']}/{total} sandboxes  {state['done'] / el:6.1f}/s  "
                  f"errors={len(state['errors'])}", end="", flush=True)
    for t in threads:
        t.join()
    if sys.stdout.isatty():
        print()
    return state, lat, time.monotonic() - t_start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sandboxes", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--edge", help="dsec-edge binary (default: $DSEC_EDGE_BIN or "
                                   "build/release/src/edge/dsec-edge)")
    ap.add_argument("--settle-s", type=float, default=60,
                    help="how long the figures may take to return to baseline")
    args = ap.parse_args()
    if args.edge:
        os.environ["DSEC_EDGE_BIN"] = args.edge
    reason = edge_harness.why_not_runnable()
    if reason:
        print(f"[  SKIPPED ] soak: {reason}")
        return SKIP

    edge = Edge.start(prefix="dsec-soak-")
    ok = True
    try:
        c = edge.client(validate=False)
        # Warm up (first create/exec touch lazily-made things: netns pool, agent threads),
        # then take the baseline once the edge is quiet.
        for _ in range(2):
            sid = c.post("/v1/sandboxes", {"memory_mb": 64, "disk_mb": 32}).json["id"]
            c.post(f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"]})
            c.delete(f"/v1/sandboxes/{sid}")
        time.sleep(0.5)
        base = figures(edge)
        print(f"soak: {args.sandboxes} sandboxes, {args.clients} clients, edge pid {edge.pid}, "
              f"instance {edge.instance}")
        # Two halves: the edge's RSS after the first one is the reference for the second.
        half = args.sandboxes // 2
        state, lat, elapsed = run(edge, half, args.clients)
        mid_rss = edge_rss_kb(edge.pid)
        state2, lat2, elapsed2 = run(edge, args.sandboxes - half, args.clients)
        state["done"] += state2["done"]
        state["errors"] += state2["errors"]
        for k in lat:
            lat[k] += lat2[k]
        elapsed += elapsed2
        # Teardown is asynchronous in places: poll for the baseline with a deadline.
        deadline = time.monotonic() + args.settle_s
        after = figures(edge)
        while (any(after[k] > base[k] for k in COMPARED)
               and time.monotonic() < deadline):
            time.sleep(0.25)
            after = figures(edge)
        peak_list = c.get("/v1/sandboxes?limit=1000").json["sandboxes"]

        print(f"  done {state['done']}/{args.sandboxes} in {elapsed:.1f}s "
              f"({state['done'] / elapsed:.1f} sandboxes/s), errors {len(state['errors'])}")
        for k in ("create", "exec", "delete"):
            s = sorted(lat[k])
            print(f"  {k:7s} ms: p50 {pct(s, 50):7.1f}  p99 {pct(s, 99):7.1f}  "
                  f"max {s[-1] if s else float('nan'):7.1f}")
        print(f"  {'figure':16s} {'before':>8s} {'after':>8s}")
        for k in base:
            mark = ""
            if k in COMPARED:
                mark = "  OK" if after[k] <= base[k] else "  LEAK"
            elif k == "edge_rss_kb":
                mark = (f"  (after the first half: {mid_rss}; growth in the second half "
                        f"{after[k] - mid_rss} kB, at most {RSS_SLACK_KB})")
            elif k == "netns_pool":
                mark = (f"  (namespaces of live sandboxes and pool workers, plus idle ones kept"
                        f" for reuse; <= {base[k] + args.clients + 2})")
            else:
                mark = "  (informational)"
            print(f"  {k:16s} {base[k]:8d} {after[k]:8d}{mark}")
        if state["errors"]:
            ok = False
            print("FAIL: requests failed:")
            for e in state["errors"][:10]:
                print("   ", e)
        if state["done"] != args.sandboxes:
            ok = False
            print(f"FAIL: only {state['done']} of {args.sandboxes} sandboxes completed")
        leaks = [k for k in COMPARED if after[k] > base[k]]
        if leaks:
            ok = False
            print(f"FAIL: not back to baseline: {', '.join(leaks)}")
            if "edge_fds" in leaks:
                print("  edge fds now:")
                for line in fd_targets(edge.pid):
                    print("   ", line)
        if peak_list:
            ok = False
            print(f"FAIL: {len(peak_list)} sandboxes still listed")
        # The namespaces held at the start (fncall workers, idle ones) plus at most one per
        # concurrent client came back to the pool.
        if after["netns_pool"] > base["netns_pool"] + args.clients + 2:
            ok = False
            print(f"FAIL: idle netns pool {after['netns_pool']} is more than the peak "
                  f"concurrency ({args.clients} clients) explains")
        if after["edge_rss_kb"] > mid_rss + RSS_SLACK_KB:
            ok = False
            print(f"FAIL: edge RSS grew {mid_rss} -> {after['edge_rss_kb']} kB in the second half")
        if after["threads"] > base["threads"] + 8:
            ok = False
            print(f"FAIL: edge threads grew {base['threads']} -> {after['threads']}")
    finally:
        residue = edge.shutdown_and_check()
        if residue:
            ok = False
            print(f"FAIL: residue after SIGTERM: {residue}")
            print(edge.log_tail(40))
        edge.cleanup()
    print("soak: PASS" if ok else "soak: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
