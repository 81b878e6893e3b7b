"""request_id / Idempotency-Key on a live edge: a retry replays the first result and never
runs the command twice; a different body with the same key is 409; keys are scoped by method
and path; a retry during the first run waits for it."""

import threading
import uuid

from edge_harness import wait_until


def rid():
    return "rid-" + uuid.uuid4().hex


def lines_in(client, sid, path):
    return client.sh(sid, f"cat {path} 2>/dev/null | wc -l").strip()


def test_exec_request_id_runs_once(client, sandbox):
    key = rid()
    body = {"shell": "echo ran >> /workspace/once.log; date +%s%N; wc -l < /workspace/once.log",
            "request_id": key}
    first = client.post(f"/v1/sandboxes/{sandbox}/exec", body, expect=200)
    for _ in range(3):
        again = client.post(f"/v1/sandboxes/{sandbox}/exec", body, expect=200)
        assert again.body == first.body  # the same result, byte for byte
        assert again.headers.get("idempotent-replay") == "true"
    assert lines_in(client, sandbox, "/workspace/once.log") == "1"
    # Same key, different body: 409 and still not run.
    other = dict(body, shell="echo ran >> /workspace/once.log")
    r = client.post(f"/v1/sandboxes/{sandbox}/exec", other, expect=409)
    assert r.json["error"]["code"] == "conflict"
    assert lines_in(client, sandbox, "/workspace/once.log") == "1"
    # The header works the same way, and must agree with the body.
    key2 = rid()
    b2 = {"shell": "echo ran >> /workspace/once.log; echo second"}
    r1 = client.post(f"/v1/sandboxes/{sandbox}/exec", b2, headers={"Idempotency-Key": key2},
                     expect=200)
    r2 = client.post(f"/v1/sandboxes/{sandbox}/exec", b2, headers={"Idempotency-Key": key2},
                     expect=200)
    assert r1.body == r2.body
    assert lines_in(client, sandbox, "/workspace/once.log") == "2"
    client.post(f"/v1/sandboxes/{sandbox}/exec", dict(b2, request_id="other"),
                headers={"Idempotency-Key": key2}, expect=400, validate=False)


def test_retry_while_running_waits_for_the_first(client, sandbox):
    key = rid()
    body = {"shell": "echo x >> /workspace/conc.log; "
                     "while [ ! -e /workspace/conc-go ]; do sleep 0.02; done; echo finished",
            "request_id": key}
    results = []

    def call():
        c = type(client)(client.url, client.token)
        results.append(c.post(f"/v1/sandboxes/{sandbox}/exec", body, expect=200))

    threads = [threading.Thread(target=call) for _ in range(3)]
    threads[0].start()
    wait_until(lambda: lines_in(client, sandbox, "/workspace/conc.log") == "1", 10,
               what="first call running")
    for t in threads[1:]:
        t.start()
    # The duplicates are waiting, not running: still one line.
    assert lines_in(client, sandbox, "/workspace/conc.log") == "1"
    client.put(f"/v1/sandboxes/{sandbox}/files?path=/workspace/conc-go", b"", expect=204)
    for t in threads:
        t.join(60)
    assert len(results) == 3
    assert {r.body for r in results} == {results[0].body}
    assert results[0].json["stdout"] == "finished\n"
    assert lines_in(client, sandbox, "/workspace/conc.log") == "1"


def test_create_request_id_makes_one_sandbox(client):
    key = rid()
    body = {"memory_mb": 64, "labels": {"idem": key[-12:]}, "request_id": key}
    a = client.post("/v1/sandboxes", body, expect=201).json
    b = client.post("/v1/sandboxes", body, expect=201).json
    try:
        assert a["id"] == b["id"]
        got = client.get(f"/v1/sandboxes?label=idem={key[-12:]}", expect=200).json["sandboxes"]
        assert [s["id"] for s in got] == [a["id"]]
    finally:
        client.remove(a["id"])
    # A replay of a deleted sandbox's create still answers the first result (not a new one).
    c = client.post("/v1/sandboxes", body, expect=201).json
    assert c["id"] == a["id"]
    client.get(f"/v1/sandboxes/{a['id']}", expect=404)


def test_keys_are_scoped_by_method_and_path(client, sandbox):
    key = rid()
    r1 = client.post(f"/v1/sandboxes/{sandbox}/exec", {"shell": "echo a", "request_id": key},
                     expect=200)
    sb2 = client.create({"memory_mb": 64})
    try:
        # The same key on another path is another request.
        r2 = client.post(f"/v1/sandboxes/{sb2['id']}/exec",
                         {"shell": "echo b", "request_id": key}, expect=200)
        assert r2.json["stdout"] == "b\n" and r1.json["stdout"] == "a\n"
    finally:
        client.remove(sb2["id"])


def test_put_and_delete_with_idempotency_key(client, sandbox):
    key = rid()
    url = f"/v1/sandboxes/{sandbox}/files?path=/workspace/idem.txt"
    client.put(url, b"v1", headers={"Idempotency-Key": key}, expect=204)
    client.put(url, b"v2", expect=204)  # an unrelated write in between
    client.put(url, b"v1", headers={"Idempotency-Key": key}, expect=204)  # replay: no write
    assert client.get(url, expect=200).body == b"v2"
    client.put(url, b"v3", headers={"Idempotency-Key": key}, expect=409)
    # DELETE: the retry gets the first 204, not a 404.
    sb = client.create({"memory_mb": 64})
    dkey = rid()
    client.delete(f"/v1/sandboxes/{sb['id']}", headers={"Idempotency-Key": dkey}, expect=204)
    client.delete(f"/v1/sandboxes/{sb['id']}", headers={"Idempotency-Key": dkey}, expect=204)
    client.delete(f"/v1/sandboxes/{sb['id']}", expect=404)


def test_shell_run_and_background_request_id(client, sandbox):
    sh = client.post(f"/v1/sandboxes/{sandbox}/shells", {"request_id": rid()},
                     expect=201).json["shell_id"]
    key = rid()
    url = f"/v1/sandboxes/{sandbox}/shells/{sh}/run"
    body = {"command": "echo y >> /workspace/sh.log; wc -l < /workspace/sh.log",
            "request_id": key}
    a = client.post(url, body, expect=200)
    b = client.post(url, body, expect=200)
    assert a.body == b.body and a.json["stdout"] == "1\n"
    assert lines_in(client, sandbox, "/workspace/sh.log") == "1"
    key = rid()
    body = {"shell": "echo z >> /workspace/bg.log", "background": True, "request_id": key}
    e1 = client.post(f"/v1/sandboxes/{sandbox}/exec", body, expect=202).json["exec_id"]
    e2 = client.post(f"/v1/sandboxes/{sandbox}/exec", body, expect=202).json["exec_id"]
    assert e1 == e2
    client.get(f"/v1/sandboxes/{sandbox}/execs/{e1}?wait_ms=30000", expect=200)
    assert lines_in(client, sandbox, "/workspace/bg.log") == "1"


def test_streamed_exec_request_id_replays(client, sandbox):
    key = rid()
    body = {"shell": "echo s >> /workspace/st.log; echo streamed", "request_id": key}
    a = client.post(f"/v1/sandboxes/{sandbox}/exec?stream=1", body, expect=200)
    b = client.post(f"/v1/sandboxes/{sandbox}/exec?stream=1", body, expect=200)
    assert a.body == b.body and b"streamed" in a.body
    assert lines_in(client, sandbox, "/workspace/st.log") == "1"


def test_bad_keys(client, sandbox):
    for key in ("x" * 129, "tab\there", "nl\x7f"):
        r = client.post(f"/v1/sandboxes/{sandbox}/exec", {"shell": "true"},
                        headers={"Idempotency-Key": key}, validate=False)
        assert r.status == 400, (key, r)
        client.check(r, validate=False)
