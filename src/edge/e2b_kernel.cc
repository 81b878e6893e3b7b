// The code interpreter's kernel (e2b_interpreter.h): a persistent Python process inside the
// sandbox, standard library only. Requests arrive as JSON lines on stdin ({"code", "env_vars",
// "timeout_s"}: past it the cell raises TimeoutError);
// each execution answers E2B's NDJSON lines (number_of_executions, stdout, stderr, result,
// error, end_of_execution) on stdout. The first line it writes is {"type": "ready"}.
#include "edge/e2b_interpreter.h"

namespace dsec::edge {

// Started as `python3 -c kE2bKernelBoot`, which reads one JSON string (this source) from stdin
// and runs it: the kernel's text stays out of the sandbox's process list. What came after that
// line in the same read (requests written at once, as /run_jupyter does) is `_pending`.
const char kE2bKernelBoot[] =
    "import os,json\n"
    "b=b''\n"
    "while b'\\n' not in b:\n"
    " c=os.read(0,65536)\n"
    " if not c: raise SystemExit(0)\n"
    " b+=c\n"
    "l,_pending=b.split(b'\\n',1)\n"
    "exec(compile(json.loads(l),'<dsec-kernel>','exec'))";

const char kE2bKernelSource[] = R"PY(
import ast
import base64
import builtins
import codecs
import datetime
import fcntl
import json
import linecache
import os
import select
import signal
import sys
import termios
import threading
import traceback
import types


def _kernel():
    # The protocol's descriptors move out of the way of user code and its children: requests
    # arrive on a private copy of stdin, events leave on a private copy of stdout; fd 0 becomes
    # /dev/null and fds 1 and 2 pipes that this kernel reads and reports as stdout/stderr.
    proto_in = os.dup(0)
    proto_out = os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    wlock = threading.Lock()

    def emit(obj):
        data = (json.dumps(obj) + "\n").encode()
        with wlock:
            while data:
                data = data[os.write(proto_out, data):]

    def now():
        t = datetime.datetime.now(datetime.timezone.utc)
        return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    class Pipe:
        def __init__(self, fd, kind):
            r, w = os.pipe()
            os.dup2(w, fd)
            os.close(w)
            self.r, self.kind, self.busy = r, kind, False
            self.cond = threading.Condition()
            self.dec = codecs.getincrementaldecoder("utf-8")("replace")
            threading.Thread(target=self.run, daemon=True).start()

        def run(self):
            while True:
                select.select([self.r], [], [])
                with self.cond:
                    self.busy = True
                try:
                    data = os.read(self.r, 65536)
                    text = self.dec.decode(data)
                    if text:
                        emit({"type": self.kind, "text": text, "timestamp": now()})
                finally:
                    with self.cond:
                        self.busy = False
                        self.cond.notify_all()

        def pending(self):
            return int.from_bytes(fcntl.ioctl(self.r, termios.FIONREAD, b"\0\0\0\0"), "little")

        def drain(self):
            # Until what was written before now has been reported (children that keep the
            # pipe open do not hold this up; what they write later goes out later).
            with self.cond:
                while self.busy or self.pending():
                    self.cond.wait(0.01)

    pipes = [Pipe(1, "stdout"), Pipe(2, "stderr")]

    def stream(fd):
        f = open(fd, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
        f.reconfigure(write_through=True)
        return f

    sys.stdin = open(0, "r", closefd=False)
    sys.stdout, sys.stderr = stream(1), stream(2)

    main = types.ModuleType("__main__")
    ns = main.__dict__
    ns["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.argv = [""]

    def flush():
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        for p in pipes:
            p.drain()

    reprs = (("_repr_html_", "html"), ("_repr_markdown_", "markdown"), ("_repr_svg_", "svg"),
             ("_repr_png_", "png"), ("_repr_jpeg_", "jpeg"), ("_repr_pdf_", "pdf"),
             ("_repr_latex_", "latex"), ("_repr_json_", "json"),
             ("_repr_javascript_", "javascript"))

    def result(value, is_main):
        out = {"type": "result", "is_main_result": is_main}
        try:
            text = repr(value)
        except Exception:
            text = object.__repr__(value)
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            text = text[1:-1]
        out["text"] = text
        if not isinstance(value, type):
            for attr, key in reprs:
                try:
                    r = getattr(value, attr, None)
                    r = r() if callable(r) else None
                except Exception:
                    r = None
                if isinstance(r, tuple):
                    r = r[0]
                if isinstance(r, (bytes, bytearray)):
                    r = base64.b64encode(r).decode()
                if r is not None:
                    out[key] = r
        flush()
        emit(out)

    def display(*objs):
        for o in objs:
            result(o, False)

    ns["display"] = display

    def error(e):
        # The user's frames only: from the first frame of a cell on, none of this kernel's.
        tb = traceback.extract_tb(e.__traceback__)
        first = next((i for i, f in enumerate(tb) if f.filename.startswith("<cell-")), len(tb))
        frames = [f for f in tb[first:] if f.filename != "<dsec-kernel>"]
        text = ""
        if frames:
            text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
        text += "".join(traceback.format_exception_only(type(e), e))
        flush()
        emit({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": text})

    state = {"busy": False}

    def on_sigint(signum, frame):
        if state["busy"]:
            raise KeyboardInterrupt

    def on_alarm(signum, frame):
        if state["busy"]:
            raise TimeoutError("the cell ran past its timeout of %g s" % state["timeout"])

    signal.signal(signal.SIGINT, on_sigint)
    signal.signal(signal.SIGALRM, on_alarm)
    count = 0

    def run(req):
        nonlocal count
        count += 1
        emit({"type": "number_of_executions", "execution_count": count})
        code = req.get("code")
        env = req.get("env_vars") or {}
        saved = {k: os.environ.get(k) for k in env}
        fname = "<cell-%d>" % count
        timeout = req.get("timeout_s")
        try:
            state["busy"] = True
            if isinstance(timeout, (int, float)) and timeout > 0:
                state["timeout"] = timeout
                signal.setitimer(signal.ITIMER_REAL, timeout)
            for k, v in env.items():
                os.environ[k] = str(v)
            if not isinstance(code, str):
                raise TypeError("code must be a string")
            linecache.cache[fname] = (len(code), None, code.splitlines(True), fname)
            tree = ast.parse(code, fname, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, fname, "exec"), ns)
            if last is not None:
                value = eval(compile(last, fname, "eval"), ns)
                if value is not None:
                    ns["_"] = value
                    result(value, True)
        except BaseException as e:  # noqa: B902 - user code may raise anything, SystemExit too
            state["busy"] = False
            error(e)
        finally:
            state["busy"] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            flush()
        emit({"type": "end_of_execution"})

    emit({"type": "ready"})
    buf = globals().pop("_pending", b"")
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                req = json.loads(line)
            except ValueError:
                continue
            try:
                run(req if isinstance(req, dict) else {})
            except KeyboardInterrupt:
                emit({"type": "end_of_execution"})
        try:
            chunk = os.read(proto_in, 1 << 20)
        except KeyboardInterrupt:
            continue
        if not chunk:
            return
        buf += chunk


_kernel()
)PY";

}  // namespace dsec::edge
