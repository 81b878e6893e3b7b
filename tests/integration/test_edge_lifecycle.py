"""Tests that need an edge of their own: kill -9 and restart (re-adoption and cleanup),
--persist, admission (429 over_capacity with Retry-After), per-sandbox exec limits and
upload bounds."""

import os
import shutil
import signal
import threading
import time

import pytest

from edge_harness import wait_until


def test_kill9_restart_readopts_and_cleans(make_edge):
    edge = make_edge()
    c = edge.client()
    keep = c.create({"memory_mb": 64, "labels": {"job": "restart"}, "idle_ttl_s": 0})
    lost = c.create({"memory_mb": 64, "labels": {"job": "restart"}})
    kid, lid = keep["id"], lost["id"]
    c.put(f"/v1/sandboxes/{kid}/files?path=/workspace/kept.txt", b"survives", expect=204)
    sh = c.post(f"/v1/sandboxes/{kid}/shells", {}, expect=201).json["shell_id"]
    c.post(f"/v1/sandboxes/{kid}/shells/{sh}/run",
           {"command": "mkdir -p /tmp/here && cd /tmp/here && export KEPT=yes"}, expect=200)
    body = {"shell": "echo once >> /workspace/idem.log; cat /workspace/idem.log",
            "request_id": "restart-key-1"}
    first = c.post(f"/v1/sandboxes/{kid}/exec", body, expect=200)
    # Background execs (issue 21 item 5): one runs on and writes across the restart, one has
    # ended with its output kept.
    live = c.post(f"/v1/sandboxes/{kid}/exec", {
        "shell": "echo before; while [ ! -e /workspace/bg-go ]; do sleep 0.05; done; "
                 "echo after; echo err-after >&2; sleep 300", "background": True},
        expect=202).json["exec_id"]
    ended = c.post(f"/v1/sandboxes/{kid}/exec", {"shell": "echo finished; exit 7",
                                                "background": True}, expect=202).json["exec_id"]
    assert c.get(f"/v1/sandboxes/{kid}/execs/{ended}?wait_ms=30000",
                 expect=200).json["result"]["exit_code"] == 7
    wait_until(lambda: c.get(f"/v1/sandboxes/{kid}/execs/{live}?stdout_offset=0",
                             expect=200).json["stdout"] == "before\n", 20, what="first output")
    c.post(f"/v1/sandboxes/{kid}/pause", expect=200)
    c.post(f"/v1/sandboxes/{kid}/resume", expect=200)
    lost_cgroups = edge.sandbox_cgroup_dirs(lid)
    assert lost_cgroups

    edge.kill9()
    # The sandboxes outlive the edge...
    assert edge.sandbox_pids(kid) and edge.sandbox_pids(lid)
    # ...and one of them dies while no edge watches: it cannot be adopted.
    for pid in edge.sandbox_pids(lid):
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not edge.sandbox_pids(lid), 10, what="lost sandbox dead")

    edge.launch()
    assert edge.adopted == 1, edge.ready_line
    c = edge.client()
    rec = c.get(f"/v1/sandboxes/{kid}", expect=200).json
    assert rec["state"] == "running" and rec["labels"] == {"job": "restart"}
    assert rec["created_at"] == keep["created_at"] and rec["expires_at"] == keep["expires_at"]
    # The one it could not re-adopt says so (410 gone, reason lost) rather than "never was".
    err = c.get(f"/v1/sandboxes/{lid}", expect=410).json["error"]
    assert err["code"] == "gone" and err["reason"] == "lost", err
    assert "re-adopt" in err["message"], err
    wait_until(lambda: not edge.sandbox_cgroup_dirs(lid), 10, what="lost sandbox cleaned")
    # Files and the shell session survived.
    assert c.get(f"/v1/sandboxes/{kid}/files?path=/workspace/kept.txt",
                 expect=200).body == b"survives"
    r = c.post(f"/v1/sandboxes/{kid}/shells/{sh}/run", {"command": 'pwd; echo "$KEPT"'},
               expect=200).json
    assert r["stdout"] == "/tmp/here\nyes\n"
    # The background execs are found again: listed, the ended one with its result and output,
    # the running one still running, its output continuing past what was read before.
    listed = {e["exec_id"]: e for e in c.get(f"/v1/sandboxes/{kid}/execs",
                                             expect=200).json["execs"]}
    assert listed[live]["state"] == "running" and listed[ended]["state"] == "exited"
    st = c.get(f"/v1/sandboxes/{kid}/execs/{ended}", expect=200).json
    assert st["result"]["exit_code"] == 7 and st["result"]["stdout"] == "finished\n"
    c.put(f"/v1/sandboxes/{kid}/files?path=/workspace/bg-go", b"", expect=204)
    st = c.get(f"/v1/sandboxes/{kid}/execs/{live}?stdout_offset=7&wait_ms=30000",
               expect=200).json
    assert (st["state"], st["stdout"], st["stdout_offset"]) == ("running", "after\n", 13), st
    wait_until(lambda: c.get(f"/v1/sandboxes/{kid}/execs/{live}?stderr_offset=0",
                             expect=200).json["stderr"] == "err-after\n", 20, what="stderr")
    st = c.post(f"/v1/sandboxes/{kid}/execs/{live}/kill", None, expect=200).json
    assert st["state"] == "exited" and st["result"]["signal"] == 9
    assert st["result"]["stdout"] == "before\nafter\n"
    c.delete(f"/v1/sandboxes/{kid}/execs/{live}", expect=204)
    c.get(f"/v1/sandboxes/{kid}/execs/{live}", expect=404)
    # The idempotency record is durable: the retry replays and does not run again.
    again = c.post(f"/v1/sandboxes/{kid}/exec", body, expect=200)
    assert again.body == first.body
    assert c.post(f"/v1/sandboxes/{kid}/exec", {"shell": "wc -l < /workspace/idem.log"},
                  expect=200).json["stdout"] == "1\n"
    # It works as before: new sandboxes, listing, and the node's count.
    new = c.create({"memory_mb": 64, "labels": {"job": "restart"}})
    assert {s["id"] for s in c.get("/v1/sandboxes?label=job=restart",
                                   expect=200).json["sandboxes"]} == {kid, new["id"]}
    assert c.get("/v1/node", expect=200).json["usage"]["sandboxes"] == 2
    # Pause across a restart is kept.
    c.post(f"/v1/sandboxes/{kid}/pause", expect=200)
    edge.kill9()
    edge.launch()
    assert edge.adopted == 2
    c = edge.client()
    assert c.get(f"/v1/sandboxes/{kid}", expect=200).json["state"] == "paused"
    assert c.post(f"/v1/sandboxes/{kid}/exec", {"shell": "cat /workspace/kept.txt"},
                  expect=200).json["stdout"] == "survives"
    # SIGTERM (in the fixture's teardown) destroys both and leaves nothing behind.


def test_persist_leaves_sandboxes_for_the_next_edge(make_edge):
    edge = make_edge(extra_args=["--persist"])
    c = edge.client()
    sb = c.create({"memory_mb": 64})
    c.put(f"/v1/sandboxes/{sb['id']}/files?path=/workspace/p.txt", b"persisted", expect=204)
    assert edge.stop() == 0
    assert edge.sandbox_pids(sb["id"]), "with --persist the sandbox outlives a SIGTERM"
    edge.extra_args = []  # the next edge destroys everything on SIGTERM
    edge.launch()
    assert edge.adopted == 1
    c = edge.client()
    assert c.get(f"/v1/sandboxes/{sb['id']}/files?path=/workspace/p.txt",
                 expect=200).body == b"persisted"


def test_failed_start_exits_cleanly_and_leaves_adopted_sandboxes(make_edge):
    # A start-up that fails after it re-adopted sandboxes (here the spool dir cannot be made)
    # stops what it started and exits with an error, instead of aborting on a thread still
    # running, and leaves the sandboxes as they were for the next edge.
    edge = make_edge(extra_args=["--persist"])
    c = edge.client()
    sb = c.create({"memory_mb": 64})
    c.put(f"/v1/sandboxes/{sb['id']}/files?path=/workspace/k.txt", b"kept", expect=204)
    assert edge.stop() == 0
    spool = edge.state_dir / "spool"
    shutil.rmtree(spool, ignore_errors=True)
    spool.write_text("not a directory")
    with pytest.raises(RuntimeError) as err:
        edge.launch()
    assert "rc=1)" in str(err.value) and "dsec-edge: spool dir:" in str(err.value), str(err.value)
    assert edge.sandbox_pids(sb["id"]), "a failed start must leave adopted sandboxes running"
    spool.unlink()
    edge.extra_args = []
    edge.launch()
    assert edge.adopted == 1
    assert edge.client().get(f"/v1/sandboxes/{sb['id']}/files?path=/workspace/k.txt",
                             expect=200).body == b"kept"


def test_the_edges_own_syscall_failure_is_500_not_the_callers_fault(make_edge):
    # A create the edge cannot carry out for a reason of its own (here: its sandboxes
    # directory is immutable, so its mkdir fails with EPERM) is a 500 internal error; mapped
    # from the errno it would read 403 forbidden, as if the caller lacked a permission.
    import subprocess
    if shutil.which("chattr") is None:
        pytest.skip("chattr (e2fsprogs) is not installed")
    edge = make_edge(config={"fncall_pools": False})
    c = edge.client()
    sandboxes = edge.state_dir / "sandboxes"
    if subprocess.run(["chattr", "+i", str(sandboxes)], capture_output=True).returncode != 0:
        pytest.skip("the state dir's filesystem has no immutable attribute")
    try:
        r = c.post("/v1/sandboxes", {"memory_mb": 64}, expect=500)
        assert r.json["error"]["code"] == "internal", r.json
        assert "EPERM" in r.json["error"]["message"], r.json
    finally:
        subprocess.run(["chattr", "-i", str(sandboxes)], check=True)
    sb = c.create({"memory_mb": 64})  # the node is fine again, and so is the edge
    c.delete(f"/v1/sandboxes/{sb['id']}", expect=204)


def test_second_edge_on_same_state_dir_refused(make_edge):
    import subprocess
    edge = make_edge()
    out = subprocess.run([str(edge.binary), "--listen", "127.0.0.1:0", "--socket", "",
                          "--state-dir", str(edge.state_dir), "--token-file",
                          str(edge.token_file)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "another dsec-edge" in out.stderr
    assert edge.client().get("/v1/health", expect=200)


def test_capacity_429_with_retry_after(make_edge):
    # (No fncall pools: their workers count toward max_sandboxes too.)
    edge = make_edge(extra_args=["--max-sandboxes", "2", "--memory-overcommit", "0.1"],
                     config={"fncall_pools": False})
    c = edge.client()
    node = c.get("/v1/node", expect=200).json
    assert node["capacity"]["max_sandboxes"] == 2
    admit = node["capacity"]["admit_memory_mb"]
    # What could never fit is 422 with the node's maximum, not a 429 to retry: one sandbox
    # asking for more than the admitted total, more CPUs than the node has, or a count whose
    # sum is more than the node admits.
    r = c.post("/v1/sandboxes", {"memory_mb": admit + 1}, expect=422)
    assert r.json["error"]["code"] == "unprocessable" and "retry-after" not in r.headers
    assert f"at most {admit} MiB" in r.json["error"]["message"], r.json
    # The message's formula is the one /v1/node reports: (memory - reserve) * overcommit.
    cap = node["capacity"]
    assert abs(admit - int((cap["memory_mb"] - cap["reserve_memory_mb"]) * 0.1)) <= 1, cap
    assert (f"the node's {cap['memory_mb']} MiB less reserve_memory_mb "
            f"{cap['reserve_memory_mb']}, times memory_overcommit 0.1") in r.json["error"]["message"]
    cpus = len(os.sched_getaffinity(0))
    r = c.post("/v1/sandboxes", {"cpu": cpus + 1}, expect=422)
    assert f"it has {cpus} CPUs" in r.json["error"]["message"], r.json
    r = c.post("/v1/sandboxes", {"memory_mb": admit // 2 + 1, "count": 2}, expect=422)
    assert "create fewer at once" in r.json["error"]["message"], r.json
    # Memory that is committed now: 429 with Retry-After, all or nothing.
    a = c.create({"memory_mb": admit - 16})
    r = c.post("/v1/sandboxes", {"memory_mb": 32}, expect=429)
    assert r.json["error"]["code"] == "over_capacity" and int(r.headers["retry-after"]) >= 1
    r = c.post("/v1/sandboxes", {"memory_mb": 16, "count": 2}, expect=429)  # all or nothing
    assert c.get("/v1/node", expect=200).json["usage"]["sandboxes"] == 1
    b = c.create({"memory_mb": 16})
    r = c.post("/v1/sandboxes", {"memory_mb": 16}, expect=429)  # max_sandboxes
    assert r.headers["retry-after"].isdigit()
    # Rejections are counted in /metrics.
    text = c.get("/metrics", expect=200).body.decode()
    assert 'dsec_rejects_total{reason="max_sandboxes"}' in text
    assert 'dsec_rejects_total{reason="memory"}' in text
    # A 429 is not recorded for idempotency: the same request id succeeds once there is room.
    body = {"memory_mb": 16, "request_id": "cap-retry"}
    c.post("/v1/sandboxes", body, expect=429)
    c.delete(f"/v1/sandboxes/{a['id']}", expect=204)
    d = c.post("/v1/sandboxes", body, expect=201).json
    assert c.post("/v1/sandboxes", body, expect=201).json["id"] == d["id"]
    c.delete(f"/v1/sandboxes/{b['id']}", expect=204)
    c.delete(f"/v1/sandboxes/{d['id']}", expect=204)
    assert c.get("/v1/node", expect=200).json["usage"] == {"sandboxes": 0, "memory_mb": 0,
                                                           "by_state": {}}


def test_execs_per_sandbox_and_upload_bounds(make_edge):
    edge = make_edge(config={"max_execs_per_sandbox": 2, "max_upload_bytes": 1 << 20,
                             "max_json_body_bytes": 64 << 10, "max_output_bytes": 4096})
    c = edge.client()
    sid = c.create({"memory_mb": 64})["id"]
    e1 = c.post(f"/v1/sandboxes/{sid}/exec", {"cmd": ["sleep", "300"], "background": True},
                expect=202).json["exec_id"]
    e2 = c.post(f"/v1/sandboxes/{sid}/exec", {"cmd": ["sleep", "300"], "background": True},
                expect=202).json["exec_id"]
    r = c.post(f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"]}, expect=429)
    assert r.json["error"]["code"] == "over_capacity" and "retry-after" in r.headers
    c.post(f"/v1/sandboxes/{sid}/execs/{e1}/kill", None, expect=200)
    wait_until(lambda: c.post(f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"]}).status == 200,
               10, what="a slot is free again")
    c.delete(f"/v1/sandboxes/{sid}/execs/{e2}", expect=204)
    # Uploads over max_upload_bytes: 413 before the body is read.
    c.put(f"/v1/sandboxes/{sid}/files?path=/workspace/ok", b"x" * (1 << 20), expect=204)
    r = c.put(f"/v1/sandboxes/{sid}/files?path=/workspace/big", b"x" * ((1 << 20) + 1),
              expect=413)
    assert r.json["error"]["code"] == "too_large"
    c.put(f"/v1/sandboxes/{sid}/archive?path=/workspace/t", b"\0" * (2 << 20), expect=413)
    c.post(f"/v1/sandboxes/{sid}/exec", {"shell": "true", "stdin": "x" * (70 << 10)},
           expect=413)
    # Output over the node's cap is refused as a request, and capped by default.
    c.post(f"/v1/sandboxes/{sid}/exec", {"shell": "true", "max_output_bytes": 4097},
           expect=400)
    # A chunked upload without Content-Length is bounded while it is read.
    conn = c.connect()
    try:
        conn.putrequest("PUT", f"/v1/sandboxes/{sid}/files?path=/workspace/chunked")
        conn.putheader("Authorization", f"Bearer {edge.token}")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        status = None
        try:
            for _ in range(40):
                chunk = b"y" * 65536
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            conn.send(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        resp = conn.getresponse()
        status = resp.status
        resp.read()
    finally:
        conn.close()
    assert status == 413
    assert c.get("/v1/health", expect=200)


def test_many_concurrent_clients(make_edge):
    """Concurrent creates, execs and deletes from several threads do not interfere."""
    edge = make_edge()
    errors = []

    def worker(n):
        c = edge.client(keep_alive=True)
        try:
            for i in range(4):
                sb = c.create({"memory_mb": 32, "labels": {"w": str(n)}})
                r = c.exec(sb["id"], f"echo {n}-{i}")
                if r["stdout"] != f"{n}-{i}\n":
                    errors.append(r)
                c.delete(f"/v1/sandboxes/{sb['id']}", expect=204)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
        finally:
            c.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert edge.client().get("/v1/node", expect=200).json["usage"]["sandboxes"] == 0
    assert time.monotonic() - t0 < 120
