"""SDK unit tests (fake server): image builds — build_image from images or a
Debian base, the log streamed to on_log, failures as BuildFailedError,
cancel (queued, running, by interrupting the wait), get_build / build_log /
cancel_build / wait_build, request validation and the errors the node
answers with; on the blocking and the asyncio client."""

from __future__ import annotations

import asyncio
import pickle
import time

import pytest

from libdsec import (
    AsyncDSecClient,
    BadRequestError,
    Build,
    BuildFailedError,
    BuildStep,
    ConflictError,
    DSecError,
    DSecTimeoutError,
    NotFoundError,
    OverCapacityError,
)

POLL = 0.01


@pytest.fixture(autouse=True)
def fast_builds(edge):
    edge.build_step_s = 0.02
    edge.build_cancel_s = 0.03


def step_names(build):
    return [s.name for s in build.steps]


def full_log(client, build_id, max_bytes=None):
    text, offset, pages = "", 0, 0
    while True:
        t, offset, done = client.build_log(build_id, offset, max_bytes)
        pages += 1
        if not t:
            return text, offset, done, pages
        text += t


# ---- success -----------------------------------------------------------------------------------


def test_build_from_images_streams_the_log(client, edge):
    logs = []
    b = client.build_image("proj:1", from_="host", run=["echo hi", "echo ünïcode ✓"],
                           env={"A": "1"}, workdir="/src", memory_mb=1024, disk_mb=2048,
                           timeout_s=600, on_log=logs.append, poll_interval=POLL)
    assert isinstance(b, Build) and b.ok and b.finished and b.state == "succeeded"
    assert b.id.startswith("bld-") and b.name == "proj:1" and b.image == "proj:1"
    assert b.error is None and b.step is None and b.current_step is None and b.progress == 1.0
    assert step_names(b) == ["start a build sandbox", "run: echo hi", "run: echo ünïcode ✓",
                             "capture the sandbox's files", "save image proj:1"]
    assert all(isinstance(s, BuildStep) and s.state == "done" for s in b.steps)
    assert b.sandbox and b.started_at >= b.created_at and b.finished_at >= b.started_at

    # on_log got the whole log, in order, each piece once.
    text = "".join(logs)
    assert text == full_log(client, b.id)[0]
    assert len(text.encode()) == b.log_bytes
    assert "[dsec] step 1/5: start a build sandbox\n" in text
    assert "$ echo hi\nhi\n" in text and "ünïcode ✓\n" in text
    assert text.endswith("[dsec] image proj:1 saved (1 layers)\n")

    body = edge.seen("POST", "/v1/images/build")[0].json
    assert body["request_id"]
    del body["request_id"]
    assert body == {"name": "proj:1", "from": "host", "run": ["echo hi", "echo ünïcode ✓"],
                    "env": {"A": "1"}, "workdir": "/src", "memory_mb": 1024, "disk_mb": 2048,
                    "timeout_s": 600}

    img = client.get_image("proj:1")
    assert img.source == "build" and img.base == "host" and "A=1" in img.config.env
    assert img.config.workdir == "/src"

    # Stacked on it; a string is one run command; no on_log, no log requests.
    n = len(edge.seen("GET"))
    b2 = client.build_image("proj:2", from_=["host", "proj:1"], run="echo more",
                            poll_interval=POLL)
    assert b2.ok and step_names(b2)[1] == "run: echo more"
    assert not [s for s in edge.seen("GET")[n:] if s.path.endswith("/log")]
    assert edge.seen("POST", "/v1/images/build")[1].json["from"] == ["host", "proj:1"]
    assert edge.seen("POST", "/v1/images/build")[1].json["run"] == ["echo more"]
    assert len(client.get_image("proj:2").layers) == 2


def test_build_from_a_debian_base(client, edge):
    b = client.build_image("py:3.11", base="debian:bookworm", packages=["python3", "git"],
                           variant="apt", run=["echo ok"], poll_interval=POLL)
    assert b.ok and step_names(b)[0] == "bootstrap debian:bookworm"
    assert step_names(b)[-1] == "save image py:3.11"
    body = edge.seen("POST", "/v1/images/build")[0].json
    assert (body["base"], body["packages"], body["variant"]) == (
        "debian:bookworm", ["python3", "git"], "apt")
    assert "from" not in body
    assert client.get_image("py:3.11").base is None
    # Without run: bootstrap and save only.
    b = client.build_image("deb:12", base="debian:bookworm", poll_interval=POLL)
    assert step_names(b) == ["bootstrap debian:bookworm", "save image deb:12"]


def test_no_wait_then_get_and_wait(client, edge):
    b = client.build_image("w:1", from_="host", run=["sleep 0.6"], wait=False)
    assert b.state in ("queued", "running") and not b.finished and not b.ok
    seen = client.get_build(b.id)
    assert seen.id == b.id and seen.raw["id"] == b.id
    with pytest.raises(DSecTimeoutError):
        client.wait_build(b.id, timeout_s=0.05, poll_interval=POLL)
    assert not client.get_build(b.id).finished  # the wait ended, not the build
    logs = []
    done = client.wait_build(b.id, poll_interval=POLL, on_log=logs.append)
    assert done.ok and "".join(logs).startswith("[dsec] step 1/4")
    with pytest.raises(NotFoundError):
        client.get_build("bld-0000000000000000")


# ---- failure -----------------------------------------------------------------------------------


def test_failed_build_raises_with_the_build(client, edge):
    logs = []
    with pytest.raises(BuildFailedError) as ei:
        client.build_image("bad:1", from_="host", run=["echo a", "exit 3", "echo never"],
                           on_log=logs.append, poll_interval=POLL)
    e = ei.value
    assert isinstance(e, DSecError) and e.code == "build_failed" and e.status is None
    assert e.build.state == "failed" and not e.build.ok and e.build.finished
    assert e.build.error == 'step "exit 3" exited with status 3'
    assert e.build.image is None and "exited with status 3" in str(e)
    assert [s.state for s in e.build.steps] == ["done", "done", "failed", "failed", "failed",
                                                 "failed"]
    text = "".join(logs)
    assert "$ exit 3\nabout to fail\n" in text and "$ echo never" not in text
    assert text.endswith('[dsec] build failed: step "exit 3" exited with status 3\n')
    with pytest.raises(NotFoundError):
        client.get_image("bad:1")
    # Picklable, build and all (it may cross process boundaries in trainers).
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is BuildFailedError and again.build == e.build
    assert again.code == e.code and str(again) == str(e)
    # Failed builds do not hold the name.
    assert client.build_image("bad:1", from_="host", run="echo fixed", poll_interval=POLL).ok


# ---- cancel ------------------------------------------------------------------------------------


def test_cancel_running_and_queued(client, edge):
    edge.build_workers = 1
    a = client.build_image("a:1", from_="host", run=["sleep 5"], wait=False)
    b = client.build_image("b:1", from_="host", run=["echo b"], wait=False)
    assert client.get_build(b.id).state == "queued"
    # Queued: canceled at once.
    gone = client.cancel_build(b.id)
    assert gone.state == "canceled" and gone.error == "canceled before it started"
    assert gone.started_at is None and all(s.state == "canceled" for s in gone.steps)
    # Running: the record says so until its command has died.
    while client.get_build(a.id).current_step is None or \
            client.get_build(a.id).current_step.name != "run: sleep 5":
        time.sleep(POLL)
    r = client.cancel_build(a.id)
    assert r.state == "running" and edge.seen("DELETE")[-1].headers["idempotency-key"]
    with pytest.raises(BuildFailedError) as ei:
        client.wait_build(a.id, poll_interval=POLL)
    c = ei.value.build
    assert ei.value.code == "build_canceled" and c.state == "canceled" and c.error == "canceled"
    assert [s.state for s in c.steps] == ["done", "canceled", "canceled", "canceled"]
    assert full_log(client, a.id)[0].endswith("[dsec] build canceled: canceled\n")
    with pytest.raises(NotFoundError):
        client.get_image("a:1")
    # A finished build is returned as it is.
    ok = client.build_image("c:1", from_="host", run="echo c", poll_interval=POLL)
    assert client.cancel_build(ok.id).state == "succeeded"
    with pytest.raises(NotFoundError):
        client.cancel_build("bld-nope")


def test_interrupting_the_wait_cancels_the_build(client, edge):
    def on_log(text):
        if "sleep" in text:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        client.build_image("int:1", from_="host", run=["sleep 5"], on_log=on_log,
                           poll_interval=POLL)
    (b,) = edge.builds.values()
    assert edge.seen("DELETE", f"/v1/images/builds/{b.id}")
    with pytest.raises(BuildFailedError, match="canceled"):
        client.wait_build(b.id, poll_interval=POLL)


# ---- the log -----------------------------------------------------------------------------------


def test_build_log_pages_and_the_kept_tail(client, edge):
    b = client.build_image("log:1", from_="host", run=["echo é✓x", "spam 5000"],
                           poll_interval=POLL)
    text, end, done, _ = full_log(client, b.id)
    assert done and end == b.log_bytes == len(text.encode())
    small, end2, _, pages = full_log(client, b.id, max_bytes=100)
    assert small == text and end2 == end and pages > 50  # whole characters per page
    t, nxt, done = client.build_log(b.id, end)
    assert (t, nxt, done) == ("", end, True)
    assert ("offset", "0") in edge.seen("GET", f"/v1/images/builds/{b.id}/log")[0].query

    # The node keeps a tail: an offset before it reads from the oldest byte kept.
    edge.build_log_keep = 1000
    logs = []
    b = client.build_image("log:2", from_="host", run=["spam 8000"], on_log=logs.append,
                           poll_interval=POLL)
    t, nxt, done = client.build_log(b.id, 0)
    assert done and nxt == b.log_bytes and len(t.encode()) <= 1000
    assert "".join(logs).endswith(t)  # what came last is complete

    with pytest.raises(ValueError):
        client.build_log(b.id, -1)
    with pytest.raises(BadRequestError):
        client.build_log(b.id, 0, max_bytes=0)
    with pytest.raises(NotFoundError):
        client.build_log("bld-nope")


# ---- validation and errors ---------------------------------------------------------------------


def test_arguments_checked_before_sending(client, edge):
    for kw in ({}, {"base": "debian:bookworm", "from_": "host", "run": ["x"]}):
        with pytest.raises(ValueError, match="base"):
            client.build_image("x:1", **kw)
    with pytest.raises(ValueError):
        client.build_image("", from_="host", run=["x"])
    with pytest.raises(ValueError):
        client.build_image("x:1", from_=[], run=["x"])
    with pytest.raises(ValueError):
        client.build_image("x:1", from_="host", run=["x"], poll_interval=0)
    with pytest.raises(TypeError):
        client.build_image("x:1", base="debian:bookworm", packages="python3")  # not a list
    with pytest.raises(TypeError):
        client.build_image("x:1", from_="host", run=["ok", 3])
    with pytest.raises(TypeError):
        client.build_image("x:1", from_="host", run=["ok", ""])
    with pytest.raises(TypeError):
        client.build_image("x:1", from_=b"host", run=["x"])
    assert not edge.seen("POST", "/v1/images/build")


@pytest.mark.parametrize("kw, match", [
    ({"from_": "host"}, "needs \"run\""),
    ({"from_": "host", "run": ["x"], "packages": ["git"]}, "packages"),
    ({"from_": ["img:1", "host"], "run": ["x"]}, "first"),
    ({"base": "ubuntu:noble"}, "debian:SUITE"),
    ({"base": "debian:Bookworm!"}, "suite"),
    ({"base": "debian:bookworm", "variant": "tiny"}, "variant"),
    ({"base": "debian:bookworm", "packages": ["Not A Package"]}, "package"),
    ({"from_": "host", "run": ["x"], "workdir": "rel"}, "absolute"),
    ({"from_": "host", "run": ["x"], "env": {"A=B": "1"}}, "env"),
    ({"from_": "host", "run": ["x"], "memory_mb": 1}, "memory_mb"),
    ({"from_": "host", "run": ["x"], "timeout_s": 0}, "timeout_s"),
])
def test_bad_requests_are_bad_request_errors(client, kw, match):
    with pytest.raises(BadRequestError, match=match) as ei:
        client.build_image("x:1", **kw)
    assert ei.value.status == 400 and ei.value.code == "bad_request"


def test_not_found_conflict_and_a_full_queue(client, edge):
    with pytest.raises(BadRequestError):
        client.build_image("Bad Name", from_="host", run=["x"])
    with pytest.raises(NotFoundError, match="nope:1"):
        client.build_image("x:1", from_=["host", "nope:1"], run=["x"])
    client.build_image("have:1", from_="host", run="echo", poll_interval=POLL)
    with pytest.raises(ConflictError, match="exists"):
        client.build_image("have:1", from_="host", run=["x"])
    with pytest.raises(BadRequestError, match="built-in"):
        client.build_image("host", from_="host", run=["x"])
    edge.build_workers, edge.max_queued_builds = 1, 1
    slow = client.build_image("slow:1", from_="host", run=["sleep 5"], wait=False)
    with pytest.raises(ConflictError, match=slow.id):  # a build of that name is going
        client.build_image("slow:1", from_="host", run=["x"])
    client.build_image("q:1", from_="host", run=["x"], wait=False)  # waits for the worker
    with pytest.raises(OverCapacityError) as ei:
        client.build_image("q:2", from_="host", run=["x"], wait=False)
    assert ei.value.status == 429
    assert len(edge.seen("POST", "/v1/images/build")) >= 4 + 4  # 429 is retried (3 times)
    client.cancel_build(slow.id)


def test_start_is_retried_once_with_one_request_id(client, edge):
    edge.fault("POST", "/v1/images/build", "drop_after")  # started, but the reply is lost
    b = client.build_image("r:1", from_="host", run=["echo"], poll_interval=POLL)
    first, second = edge.seen("POST", "/v1/images/build")
    assert first.json["request_id"] == second.json["request_id"]
    assert b.ok and len(edge.builds) == 1  # the node ran it once


def test_build_model_parses_records():
    b = Build.from_json({
        "id": "bld-1", "name": "x:1", "state": "running",
        "steps": [{"name": "start a build sandbox", "state": "done"},
                  {"name": "run: make", "state": "running"}],
        "step": 1, "progress": 0.5, "error": None, "image": None, "sandbox": "sb-1",
        "log_bytes": 10, "created_at": 1, "started_at": 2, "finished_at": None})
    assert b.current_step == BuildStep("run: make", "running") and not b.finished
    assert b.sandbox == "sb-1" and b.finished_at is None and b.progress == 0.5
    assert Build.from_json({"id": "bld-2", "state": "failed", "error": "x"}).error == "x"
    assert not Build.from_json({"id": "bld-2", "state": "failed"}).ok
    assert Build.from_json({"id": "b", "state": "succeeded", "image": "x:1"}).ok


# ---- asyncio -----------------------------------------------------------------------------------


def run(coro):
    return asyncio.run(coro)


def make(server, **kw):
    return AsyncDSecClient(server.url, retries=3, backoff_base=0.01, timeout=10, **kw)


def test_async_builds(server, edge):
    async def main():
        async with make(server) as c:
            plain, awaited = [], []

            async def alog(text):
                await asyncio.sleep(0)
                awaited.append(text)

            b = await c.build_image("a:1", from_="host", run=["echo one"], on_log=plain.append,
                                    poll_interval=POLL)
            assert b.ok and b.image == "a:1" and "$ echo one\none\n" in "".join(plain)
            b2 = await c.build_image("a:2", from_=["host", "a:1"], run="echo two", on_log=alog,
                                     poll_interval=POLL)
            assert b2.ok and "".join(awaited).endswith("saved (2 layers)\n")
            assert (await c.get_build(b.id)).ok
            text, nxt, done = await c.build_log(b.id)
            assert text == "".join(plain) and done and nxt == b.log_bytes

            with pytest.raises(BuildFailedError) as ei:
                await c.build_image("f:1", from_="host", run=["false"], poll_interval=POLL)
            assert ei.value.build.error == 'step "false" exited with status 1'

            s = await c.build_image("s:1", from_="host", run=["sleep 5"], wait=False)
            assert (await c.cancel_build(s.id)).state in ("queued", "running", "canceled")
            with pytest.raises(BuildFailedError) as ei:
                await c.wait_build(s.id, poll_interval=POLL)
            assert ei.value.code == "build_canceled"
            with pytest.raises(DSecTimeoutError):
                w = await c.build_image("w:1", from_="host", run=["sleep 5"], wait=False)
                await c.wait_build(w.id, timeout_s=0.05, poll_interval=POLL)
            await c.cancel_build(w.id)

            with pytest.raises(ValueError):
                await c.build_image("x:1", run=["x"])
            with pytest.raises(BadRequestError):
                await c.build_image("x:1", from_="host")
            with pytest.raises(NotFoundError):
                await c.build_image("x:1", from_="nope:1", run=["x"])
            with pytest.raises(ConflictError):
                await c.build_image("a:1", from_="host", run=["x"])
            with pytest.raises(NotFoundError):
                await c.get_build("bld-nope")

    run(main())


def test_async_cancelling_the_task_cancels_the_build(server, edge):
    async def main():
        async with make(server) as c:
            task = asyncio.create_task(
                c.build_image("t:1", from_="host", run=["sleep 5"], poll_interval=POLL))
            while not edge.builds:
                await asyncio.sleep(POLL)
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            (b,) = edge.builds.values()
            assert edge.seen("DELETE", f"/v1/images/builds/{b.id}")
            with pytest.raises(BuildFailedError, match="canceled"):
                await c.wait_build(b.id, poll_interval=POLL)

    run(main())
