"""SandboxFusion's /run_code API on a live edge (--sandbox-fusion-listen): the request shapes verl
sends (all eight fields, and just {"code"}), each status rule (Success, Failed on a non-zero
exit, a time limit or a failed compile, SandboxError for a language not run here or a missing
toolchain), stdin, memory_limit_MB on both paths (fncall and container sandbox), files in and
fetch_files out, 64 concurrent calls, authentication (bearer and token-in-path), bad input
answered in FastAPI's shapes, /run_jupyter's cells in one kernel, and nothing left behind.

The client here is plain HTTP, built as verl's sandbox_fusion utility builds its request
(json.dumps of the eight fields, Content-Type and Accept application/json, POST to the URL).
"""

import base64
import concurrent.futures
import http.client
import json
import shutil
import socket
import urllib.parse

import pytest

import edge_harness
from edge_fixtures import _skip_if_not_runnable, _teardown


@pytest.fixture(scope="module")
def fusion():
    _skip_if_not_runnable()
    e = edge_harness.Edge.start(config={"sandbox_fusion_listen": "127.0.0.1:0"})
    try:
        assert e.sandbox_fusion_url, e.ready_line
        yield e
    finally:
        _teardown(e)


def call(e, path, body=None, method="POST", token="path", headers=None, raw=None):
    """One request to the SandboxFusion listener: (status, parsed JSON or text)."""
    u = urllib.parse.urlsplit(e.sandbox_fusion_url)
    h = {"Content-Type": "application/json", "Accept": "application/json"}
    h.update(headers or {})
    if token == "path":
        path = f"/{e.token}{path}"
    elif token == "bearer":
        h["Authorization"] = f"Bearer {e.token}"
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body))
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        text = r.read().decode()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text
    finally:
        conn.close()


def verl_request(code, language="python", stdin="", compile_timeout=10, run_timeout=10,
                 memory_limit_mb=1024):
    # The eight fields verl's sandbox_fusion utility sends for each test case.
    return {"compile_timeout": compile_timeout, "run_timeout": run_timeout, "code": code,
            "stdin": stdin, "memory_limit_MB": memory_limit_mb, "language": language,
            "files": {}, "fetch_files": []}


def run(e, body, **kw):
    status, out = call(e, "/run_code", body, **kw)
    assert status == 200, out
    assert set(out) == {"status", "message", "compile_result", "run_result",
                        "executor_pod_name", "files"}, out
    return out


def b64(s):
    return base64.b64encode(s.encode()).decode()


def test_verl_request_shapes(fusion):
    out = run(fusion, verl_request("import sys\nprint(int(sys.stdin.read()) * 2)", stdin="21"))
    assert out["status"] == "Success" and out["message"] == "", out
    rr = out["run_result"]
    assert rr["status"] == "Finished" and rr["return_code"] == 0, rr
    assert rr["stdout"] == "42\n" and rr["stderr"] == ""
    assert isinstance(rr["execution_time"], float) and rr["execution_time"] >= 0
    assert out["compile_result"] is None and out["files"] == {}
    # Just {"code"}: python, default limits.
    out = run(fusion, {"code": "if __name__ == '__main__':\n    print('main')"})
    assert out["status"] == "Success" and out["run_result"]["stdout"] == "main\n", out


def test_status_rules(fusion):
    out = run(fusion, verl_request("raise ValueError('nope')"))
    assert out["status"] == "Failed" and out["message"] == "", out
    assert out["run_result"]["return_code"] == 1
    assert "ValueError: nope" in out["run_result"]["stderr"]
    out = run(fusion, verl_request("while True: pass", run_timeout=1))
    assert out["status"] == "Failed", out
    rr = out["run_result"]
    assert rr["status"] == "TimeLimitExceeded" and rr["return_code"] is None, rr
    assert 0.9 <= rr["execution_time"] < 10, rr
    out = run(fusion, verl_request("exit 3", language="bash"))
    assert out["status"] == "Failed" and out["run_result"]["return_code"] == 3, out
    # What the code prints and exits with cannot make its failure look like the server's.
    out = run(fusion, verl_request(
        "echo 'dsec: exec ./main: No such file or directory' >&2; exit 127", language="bash"))
    assert out["status"] == "Failed" and out["run_result"]["return_code"] == 127, out
    out = run(fusion, verl_request("x", language="cuda"))
    assert out["status"] == "SandboxError" and "cuda" in out["message"], out
    assert out["run_result"] is None


def test_compiled_languages(fusion):
    if not shutil.which("g++"):
        pytest.skip("g++ is not on this host (the host image's toolchain)")
    cpp = "#include <iostream>\nint main(){long x; std::cin >> x; std::cout << x * 3 << '\\n';}"
    out = run(fusion, verl_request(cpp, language="cpp", stdin="14"))
    assert out["status"] == "Success", out
    assert out["compile_result"]["status"] == "Finished"
    assert out["compile_result"]["return_code"] == 0
    assert out["run_result"]["stdout"] == "42\n"
    # A compile error: Failed, the compiler's message, and no run.
    out = run(fusion, verl_request("int main() { return 0", language="cpp"))
    assert out["status"] == "Failed" and out["run_result"] is None, out
    assert out["compile_result"]["return_code"] != 0
    assert "error" in out["compile_result"]["stderr"]
    # A compile that takes too long (g++ on <iostream> takes longer than 50 ms) is a time
    # limit of the compile step, and nothing runs.
    out = run(fusion, verl_request(cpp, language="cpp", compile_timeout=0.05))
    assert out["compile_result"]["status"] == "TimeLimitExceeded", out
    assert out["status"] == "Failed" and out["run_result"] is None, out
    if shutil.which("node"):
        out = run(fusion, verl_request("console.log([1,2,3].map(x => x * 2).join(','))",
                                       language="nodejs"))
        assert out["status"] == "Success" and out["run_result"]["stdout"] == "2,4,6\n", out


def test_missing_toolchain_names_the_tool(fusion):
    tools = {"go": "go", "php": "php", "lua": "lua", "ruby": "ruby", "R": "Rscript"}
    missing = [(lang, tool) for lang, tool in tools.items() if not shutil.which(tool)]
    if not missing:
        pytest.skip("every toolchain of go, php, lua, ruby, R is on this host")
    lang, tool = missing[0]
    out = run(fusion, verl_request("x", language=lang))
    assert out["status"] == "SandboxError", out
    assert tool in out["message"] and lang in out["message"], out


@pytest.mark.parametrize("fetch", [False, True], ids=["fncall", "sandbox"])
def test_memory_limit(fusion, fetch):
    body = verl_request("x = bytearray(150 << 20)\nprint(len(x))", memory_limit_mb=64)
    if fetch:  # fetch_files: the call runs in a sandbox of its own
        body["fetch_files"] = ["none.txt"]
    out = run(fusion, body)
    assert out["status"] == "Failed", out
    assert out["run_result"]["return_code"] == -9, out
    body["memory_limit_MB"] = 400
    out = run(fusion, body)
    assert out["status"] == "Success", out
    assert out["run_result"]["stdout"] == f"{150 << 20}\n"


def test_files_in_and_out(fusion):
    body = verl_request(
        "import os\n"
        "data = open('data/in.txt').read()\n"
        "open('out.txt', 'w').write(data.upper())\n"
        "os.makedirs('res', exist_ok=True)\n"
        "open('res/b.bin', 'wb').write(bytes(range(256)))\n"
        "print(data)")
    body["files"] = {"data/in.txt": b64("hello"), "skipped": None}
    body["fetch_files"] = ["out.txt", "res/b.bin", "missing.txt", "data"]
    out = run(fusion, body)
    assert out["status"] == "Success", out
    assert out["run_result"]["stdout"] == "hello\n"
    assert set(out["files"]) == {"out.txt", "res/b.bin"}, out["files"]
    assert base64.b64decode(out["files"]["out.txt"]) == b"HELLO"
    assert base64.b64decode(out["files"]["res/b.bin"]) == bytes(range(256))
    # On the fncall path too (no fetch_files): the files are in the working directory.
    body = verl_request("print(open('a/b.txt').read())")
    body["files"] = {"a/b.txt": b64("x y")}
    out = run(fusion, body)
    assert out["status"] == "Success" and out["run_result"]["stdout"] == "x y\n", out


def test_64_concurrent_calls(fusion):
    def one(i):
        return run(fusion, verl_request(f"print({i} * {i})"))

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        outs = list(pool.map(one, range(64)))
    for i, out in enumerate(outs):
        assert out["status"] == "Success", out
        assert out["run_result"]["stdout"] == f"{i * i}\n"
    # The edge's own API kept serving, and no sandbox was left behind.
    c = fusion.client()
    assert c.get("/v1/health", expect=200).json["ok"]
    sbs = c.get("/v1/sandboxes?label=dsec.compat=sandbox-fusion", expect=200).json
    assert sbs["sandboxes"] == [], sbs


def test_authentication(fusion):
    status, out = call(fusion, "/run_code", {"code": "print(1)"}, token=None)
    assert status == 401 and "detail" in out, out
    status, out = call(fusion, "/run_code", {"code": "print(1)"}, token=None,
                       headers={"Authorization": "Bearer wrong"})
    assert status == 401, out
    status, out = call(fusion, "/wrong-token/run_code", {"code": "print(1)"}, token=None)
    assert status == 401, out
    assert run(fusion, {"code": "print(1)"}, token="bearer")["status"] == "Success"
    assert call(fusion, "/v1/ping", method="GET") == (200, "pong")
    assert call(fusion, "/v1/ping", method="GET", token="bearer") == (200, "pong")


def test_bad_input(fusion):
    status, out = call(fusion, "/run_code", raw="{not json")
    assert status == 422 and isinstance(out["detail"], list), out
    status, out = call(fusion, "/run_code", {"language": "python"})
    assert status == 422 and out["detail"][0]["loc"] == ["body", "code"], out
    status, out = call(fusion, "/run_code", {"code": "x", "language": "cobol"})
    assert status == 422 and out["detail"][0]["loc"] == ["body", "language"], out
    status, out = call(fusion, "/run_code", {"code": "x", "run_timeout": -1})
    assert status == 422, out
    status, out = call(fusion, "/run_code", {"code": "x", "files": {"a": "***"}})
    assert status == 422 and out["detail"][0]["loc"] == ["body", "files", "a"], out
    status, out = call(fusion, "/run_code", method="GET")
    assert status == 405 and out == {"detail": "Method Not Allowed"}, out
    status, out = call(fusion, "/nope", {"code": "x"})
    assert status == 404 and out == {"detail": "Not Found"}, out
    # A body over sandbox_fusion_max_body_bytes (16 MiB) is refused from its head.
    u = urllib.parse.urlsplit(fusion.sandbox_fusion_url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(f"POST /{fusion.token}/run_code HTTP/1.1\r\nHost: x\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {17 << 20}\r\n\r\n"
                  .encode())
        head = s.recv(4096).decode(errors="replace")
    assert head.startswith("HTTP/1.1 413"), head
    # And it still runs code.
    assert run(fusion, {"code": "print(2)"})["run_result"]["stdout"] == "2\n"


def test_run_jupyter(fusion):
    """/run_jupyter: SandboxFusion's example cells in one kernel (state kept from cell to cell),
    each cell's stdout, stderr, display data and error; cell_timeout, total_timeout, files in
    and out, a kernel that dies, bad input."""
    body = {"cells": ["a = 123", "a", "print(a)", "import sys; sys.stderr.write('stderr message')",
                      "raise RuntimeError('error message')",
                      "class H:\n    def _repr_html_(self):\n        return '<b>h</b>'\n"
                      "display(H()); open('out.txt', 'w').write(open('in.txt').read() * 2)",
                      "import time\ntime.sleep(30)", "a + 1"],
            "cell_timeout": 1, "total_timeout": 30, "kernel": "python3",
            "files": {"in.txt": base64.b64encode(b"ab").decode()}, "fetch_files": ["out.txt"]}
    status, out = call(fusion, "/run_jupyter", body)
    assert status == 200 and out["status"] == "Success", out
    cells = out["cells"]
    assert len(cells) == 8, cells
    assert cells[0] == {"stdout": "", "stderr": "", "display": [], "error": []}
    assert cells[1]["display"] == [{"text/plain": "123"}], cells[1]
    assert cells[2]["stdout"] == "123\n"
    assert cells[3]["stderr"] == "stderr message"
    err = cells[4]["error"]
    assert err[0]["ename"] == "RuntimeError" and err[0]["evalue"] == "error message", err
    assert any("RuntimeError" in line for line in err[0]["traceback"]), err
    assert cells[5]["display"][0]["text/html"] == "<b>h</b>", cells[5]
    assert cells[6]["error"][0]["ename"] == "TimeoutError", cells[6]
    assert cells[7]["display"] == [{"text/plain": "124"}], cells[7]
    assert base64.b64decode(out["files"]["out.txt"]) == b"abab"
    assert out["driver"]["status"] == "Finished" and out["driver"]["return_code"] == 0, out

    # total_timeout over all cells: Failed, no cells (as SandboxFusion).
    status, out = call(fusion, "/run_jupyter", {"cells": ["import time", "time.sleep(30)"],
                                                "total_timeout": 1})
    assert status == 200 and out["status"] == "Failed" and out["cells"] == [], out
    assert out["driver"]["status"] == "TimeLimitExceeded", out
    # A kernel that exits mid-way: the cells that ran, and Failed saying so.
    status, out = call(fusion, "/run_jupyter", {"cells": ["print(1)", "import os; os._exit(3)",
                                                          "print(2)"]})
    assert status == 200 and out["status"] == "Failed", out
    assert [c["stdout"] for c in out["cells"]] == ["1\n"] and "1 of 3" in out["message"], out
    # Bad input in FastAPI's shape.
    status, out = call(fusion, "/run_jupyter", {"cells": "print(1)"})
    assert status == 422 and out["detail"][0]["loc"] == ["body", "cells"], out
    status, out = call(fusion, "/run_jupyter", {"cells": [], "kernel": "julia"})
    assert status == 422 and out["detail"][0]["loc"] == ["body", "kernel"], out
    status, out = call(fusion, "/run_jupyter", {})
    assert status == 422 and out["detail"][0]["type"] == "missing", out
    status, out = call(fusion, "/run_jupyter", {"cells": []})
    assert status == 200 and out["status"] == "Success" and out["cells"] == [], out
