"""A local DSec cluster for tests: a real etcd, N real dsec-edges and M dsec-apiservers on
127.0.0.1, each part under the test's control (kill -9, restart, stop etcd for a while).

Standard library only. The same layout as `scripts/cluster up DIR`, so `scripts/cluster status
DIR` and `scripts/cluster down DIR` work on a harness's dir too:

    DIR/etcd/                 etcd's data dir          DIR/etcd.log, DIR/etcd.pid
    DIR/edge-nK/              edge nK's state dir      DIR/edge-nK.log, DIR/edge-nK.pid
      tokens                  node token, cluster token (one a line)
      config.json             its config (network_cidr 10.(220+K).0.0/16, cluster_advertise)
      edge.sock               its unix socket
    DIR/apiserver-I.log/.pid  apiserver I (1-based in file names; 0-based in this API)
    DIR/node.token, DIR/cluster.token, DIR/cluster.env (ports)

    c = Cluster.start(workdir)                  # 3 edges n1..n3, 2 apiservers
    status, body = request(c.urls[0], "POST", "/v1/sandboxes", {"memory_mb": 256}, token=c.token)
    c.edge_kill("n2")                           # SIGKILL; c.edge_start("n2") restarts it
    c.etcd_stop(); c.etcd_start()               # same data dir and ports
    residue = c.shutdown_and_check()            # restarts killed edges, stops all, residue()
    c.cleanup()                                 # force-cleans leftovers, removes DIR

Edges are edge_harness.Edge objects (tests/integration), so their residue checks (cgroups of the
edge instance, mounts and loop devices under its state dir, sandbox processes) are the same as
the single-edge suite's. Processes are started from the calling (main) thread with
PR_SET_PDEATHSIG, so they get SIGTERM if the test process dies.

Environment: DSEC_EDGE_BIN, DSEC_APISERVER_BIN (defaults under build/release),
DSEC_CLUSTER_NO_REGISTER=1 starts the edges without --cluster and cluster_advertise.
"""

import http.client
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent / "integration") not in sys.path:
    sys.path.insert(0, str(HERE.parent / "integration"))

import edge_harness  # noqa: E402
from edge_harness import Edge, wait_until  # noqa: E402

REPO = HERE.parents[1]
DEFAULT_APISERVER_BIN = REPO / "build" / "release" / "src" / "apiserver" / "dsec-apiserver"


_ports_given = set()



# The port domain of every test cluster's edges and apiservers (Host headers only: no DNS).
PORT_DOMAIN = "ports.cluster.test"

def free_port():
    """A loopback port below the ephemeral range (32768-60999 on Linux): a port the kernel
    hands out for port 0 can be taken again by any outgoing connection (the edges' to etcd)
    before the daemon binds it. Never the same one twice in this process."""
    import random
    import socket
    for _ in range(1000):
        port = random.randint(20000, 32000)
        if port in _ports_given:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _ports_given.add(port)
        return port
    raise RuntimeError("no free loopback port in 20000-32000")


def apiserver_binary():
    return pathlib.Path(os.environ.get("DSEC_APISERVER_BIN") or DEFAULT_APISERVER_BIN)


def etcd_binary():
    found = shutil.which("etcd")
    return pathlib.Path(found) if found else None


def why_not_runnable(apiservers=True):
    """A reason the cluster tests cannot run here, or None."""
    reason = edge_harness.why_not_runnable()
    if reason:
        return reason
    if etcd_binary() is None:
        return ("etcd not found (apt-get install --no-install-recommends etcd-server "
                "etcd-client)")
    b = apiserver_binary()
    if apiservers and not (b.is_file() and os.access(b, os.X_OK)):
        return f"dsec-apiserver binary not found at {b} (build it or set DSEC_APISERVER_BIN)"
    return None


def register_default():
    return os.environ.get("DSEC_CLUSTER_NO_REGISTER") != "1"


# ---- HTTP ---------------------------------------------------------------------------------

def teardown(c):
    """Stops a test's cluster, removes it, and fails if it left anything behind."""
    try:
        residue = c.shutdown_and_check()
        logs = c.logs(60) if residue else ""
    finally:
        c.cleanup()
    assert not residue, f"the cluster left residue: {residue}\n{logs}"


def module_cluster(tmp_path_factory, name, **kw):
    """A module fixture's cluster (Cluster.start(..., **kw)), skipped with a printed reason on
    a host that cannot run one, torn down (and checked) after the module."""
    import pytest  # (here: the benches import this module without pytest)
    reason = why_not_runnable()
    if reason:
        print(f"[  SKIPPED ] {reason}", file=sys.stderr)
        pytest.skip(reason)
    c = Cluster.start(tmp_path_factory.mktemp(name), **kw)
    try:
        yield c
    finally:
        teardown(c)


def call(c, method, path, body=None, token=None, i=0, project=None):
    """One request to apiserver i of cluster c (the cluster token unless another is given;
    Dsec-Project when a project is named)."""
    headers = {"Dsec-Project": project} if project else None
    return request(c.urls[i], method, path, body, token=token or c.token, headers=headers)


def request(url, method, path, body=None, token=None, headers=None, timeout=60):
    """One HTTP request on a new connection: (status, parsed JSON or raw bytes). A dict or list
    body is sent as JSON; bytes as they are."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    h = {}
    if token:
        h["Authorization"] = f"Bearer {token}"
    data = None
    if isinstance(body, (dict, list)):
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    elif isinstance(body, str):
        data = body.encode()
    elif body is not None:
        data = bytes(body)
    h.update(headers or {})
    try:
        conn.request(method, path, body=data, headers=h)
        resp = conn.getresponse()
        raw = resp.read()
        ctype = resp.getheader("Content-Type", "") or ""
    finally:
        conn.close()
    if ctype.split(";")[0].strip() == "application/json" and raw:
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            pass
    return resp.status, raw


def _status(url, path, token=None, timeout=3):
    try:
        return request(url, "GET", path, token=token, timeout=timeout)
    except OSError:
        return 0, None


# ---- processes ----------------------------------------------------------------------------

def _spawn(args, log_path, pid_path):
    # The arguments beside the pid file, as scripts/cluster writes them (its `down` restarts a
    # dead edge from them to destroy the sandboxes it left).
    pathlib.Path(str(pid_path)[:-len(".pid")] + ".cmd").write_bytes(
        b"".join(str(a).encode() + b"\0" for a in args))
    with open(log_path, "ab") as log:
        log.write(f"\n==== {time.strftime('%FT%TZ', time.gmtime())} start: "
                  f"{' '.join(map(str, args))}\n".encode())
        log.flush()
        proc = subprocess.Popen([str(a) for a in args], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=log, start_new_session=True,
                                preexec_fn=edge_harness._die_with_parent)
    pathlib.Path(pid_path).write_text(f"{proc.pid}\n")
    return proc


def _signal_and_wait(proc, sig, timeout):
    """Sends sig and waits up to timeout; returns the exit code, or None if it still runs."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
    return proc.returncode


def _tail(path, n=40):
    try:
        return "\n".join(pathlib.Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class ClusterEdge(Edge):
    """An edge_harness.Edge in the cluster layout (its launch writes to DIR/edge-<name>.log
    and waits for GET /v1/health)."""

    def __init__(self, cluster, name, index, extra_args, config):
        root = cluster.root / f"edge-{name}"
        super().__init__(cluster.edge_bin, root, extra_args, config)
        self.port = free_port()  # (the base class's may be reused by an outgoing connection)
        self.url = f"http://127.0.0.1:{self.port}"
        self.cluster = cluster
        self.name = name
        self.state_dir = root  # the state dir is the edge's own dir (as in scripts/cluster)
        self.token_file = root / "tokens"
        # A unix socket path has at most 107 bytes: where the dir's path is longer (pytest's
        # basetemp under a build tree), the socket goes in a short dir of the cluster's own.
        self.socket = str(root / "edge.sock")
        if len(self.socket) > 100:
            self.socket = str(cluster.short_dir() / f"{name}.sock")
        self.config_file = root / "config.json"
        self.log_path = cluster.root / f"edge-{name}.log"
        self.pid_path = cluster.root / f"edge-{name}.pid"
        self.index = index

    def args(self):
        a = [self.binary, "--listen", f"127.0.0.1:{self.port}", "--socket", self.socket,
             "--state-dir", self.state_dir, "--token-file", self.token_file,
             "--config", self.config_file, "--node", self.name]
        if self.cluster.register:
            a += ["--cluster", f"etcd://127.0.0.1:{self.cluster.etcd_port}"]
        return a + list(self.extra_args)

    def launch(self, timeout=90):
        self.root.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(json.dumps(self.config))
        self.proc = _spawn(self.args(), self.log_path, self.pid_path)
        self.starts += 1
        self.token = self.cluster.node_token
        self.node = self.name
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"edge {self.name} exited (rc={self.proc.returncode}) before "
                                   f"it answered; log:\n{self.log_tail()}")
            st, _ = _status(self.url, "/v1/health", self.token)
            if st == 200:
                break
            if time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError(f"edge {self.name}: no GET /v1/health 200 within {timeout} s;"
                                   f" log:\n{self.log_tail()}")
            time.sleep(0.1)
        st, node = _status(self.url, "/v1/node", self.token, timeout=30)
        if st != 200 or not isinstance(node, dict):
            raise RuntimeError(f"edge {self.name}: GET /v1/node answered {st}: {node!r}")
        self.instance = node["instance"]
        return self

    def stop(self, timeout=60):
        """SIGTERM and wait; returns the exit code (SIGKILL and AssertionError after timeout)."""
        if not self.proc:
            return None
        rc = _signal_and_wait(self.proc, signal.SIGTERM, timeout)
        if rc is None:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"edge {self.name} ignored SIGTERM for {timeout}s\n"
                                 f"{self.log_tail()}")
        return rc

    def kill9(self):
        self.proc.kill()
        self.proc.wait()

    def network_residue(self):
        """The nft table and bridge this edge's network names after its instance."""
        out = []
        if not self.instance:
            return out
        tag = self.instance[:6]
        if os.path.exists(f"/sys/class/net/dsg{tag}"):
            out.append(f"bridge dsg{tag}")
        if shutil.which("nft"):
            r = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True,
                               check=False)
            if f"table inet dsec_{tag}" in r.stdout.splitlines():
                out.append(f"nft table inet dsec_{tag}")
        return out


class Cluster:
    """etcd + edges n1..nN + apiservers 0..M-1, all under one directory."""

    def __init__(self, root, edges, apiservers, edge_args, edge_config, register, compat=False):
        self.root = pathlib.Path(root)
        self._short_dir = None
        self.edge_bin = edge_harness.edge_binary()
        self.apiserver_bin = apiserver_binary()
        self.register = register
        self.node_token = os.urandom(16).hex()
        # The key of the project tokens' keyed hash, shared by the apiservers.
        self.token_hash_key = os.urandom(32).hex()
        self.token = os.urandom(16).hex()  # the cluster token (apiservers' callers)
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        while self.etcd_peer_port == self.etcd_port:
            self.etcd_peer_port = free_port()
        self.etcd_proc = None
        self.edges = {}
        for k in range(1, edges + 1):
            name = f"n{k}"
            e = ClusterEdge(self, name, k, edge_args or (), {})
            cfg = {
                # Sandboxes outlive a killed edge for a while, then go by themselves.
                "orphan_timeout_s": 600,
                # Off unless a test asks: sandbox networking NATs through the host's real
                # uplink, and an edge that stops restores the uplink's forwarding setting under
                # the edges still running (edge_harness turns it off for the same reason).
                "network": False,
                # Its own sandbox range (each edge routes its range on this host).
                "network_cidr": f"10.{220 + k}.0.0/16",
                # Host-based port URLs (the apiservers relay them too: PORT_DOMAIN).
                "port_domain": PORT_DOMAIN,
            }
            if register:
                cfg["cluster_advertise"] = e.url
            if compat:  # the compatibility listeners, which apiservers relay to
                cfg["e2b_listen"] = "127.0.0.1:0"
                cfg["sandbox_fusion_listen"] = "127.0.0.1:0"
            extra = edge_config(name) if callable(edge_config) else edge_config
            cfg.update(extra or {})
            e.config = cfg
            self.edges[name] = e
        self.apiserver_ports = [free_port() for _ in range(apiservers)]
        # Each apiserver's E2B and SandboxFusion listeners, with compat.
        self.compat_ports = [(free_port(), free_port()) for _ in range(apiservers)] \
            if compat else []
        self.apiserver_extra = []  # more dsec-apiserver arguments (for the next start)
        self.apiserver_procs = [None] * apiservers

    # -- start ------------------------------------------------------------------------------

    @classmethod
    def start(cls, workdir=None, edges=3, apiservers=2, edge_args=None, edge_config=None,
              register=None, compat=False):
        """Starts everything and waits until every apiserver lists every edge as ready.
        workdir: an empty or absent directory (None: a new temp dir). edge_config: a dict for
        every edge's config.json, or a function of the node name returning one (applied over
        the defaults). edge_args: extra dsec-edge arguments."""
        reason = why_not_runnable(apiservers > 0)
        if reason:
            raise RuntimeError(reason)
        if workdir is None:
            workdir = tempfile.mkdtemp(prefix="dsec-cluster-")
        root = pathlib.Path(os.path.realpath(workdir))
        if root.exists() and any(root.iterdir()):
            raise RuntimeError(f"{root} is not empty")
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        c = cls(root, edges, apiservers, edge_args, edge_config,
                register_default() if register is None else register, compat)
        try:
            c._write_files()
            c.etcd_start()
            for e in c.edges.values():
                e.launch()
            for i in range(apiservers):
                c.apiserver_start(i, wait_nodes=False)
            for i in range(apiservers):
                c.wait_nodes(i)
        except BaseException:
            try:
                c.cleanup()  # stops what started; keeps the dir if mounts are left
            except Exception as err:  # noqa: BLE001 -- the start failure is the news
                print(f"cluster_harness: cleanup after a failed start: {err}", file=sys.stderr)
            raise
        return c

    def _write_files(self):
        old = os.umask(0o077)
        try:
            (self.root / "node.token").write_text(self.node_token + "\n")
            (self.root / "cluster.token").write_text(self.token + "\n")
            (self.root / "token-hash.key").write_text(self.token_hash_key + "\n")
            for e in self.edges.values():
                e.root.mkdir(parents=True, exist_ok=True)
                e.token_file.write_text(f"{self.node_token}\n{self.token}\n")
        finally:
            os.umask(old)
        lines = [f"ETCD_CLIENT_PORT={self.etcd_port}", f"ETCD_PEER_PORT={self.etcd_peer_port}",
                 f"EDGES={' '.join(self.edges)}"]
        lines += [f"EDGE_PORT_{n}={e.port}" for n, e in self.edges.items()]
        lines.append("APISERVERS=" + " ".join(str(i + 1) for i in range(len(self.apiserver_ports))))
        lines += [f"APISERVER_PORT_{i + 1}={p}" for i, p in enumerate(self.apiserver_ports)]
        (self.root / "cluster.env").write_text("\n".join(lines) + "\n")

    # -- what tests use ---------------------------------------------------------------------

    @property
    def urls(self):
        return [f"http://127.0.0.1:{p}" for p in self.apiserver_ports]

    @property
    def etcd_url(self):
        return f"http://127.0.0.1:{self.etcd_port}"

    def edge_url(self, name):
        return self.edges[name].url

    def edge(self, name):
        """The edge_harness.Edge of node name (client(), residue(), sandbox_pids(), ...)."""
        return self.edges[name]

    def api(self, method, path, body=None, i=0, **kw):
        """request() to apiserver i with the cluster token."""
        return request(self.urls[i], method, path, body, token=self.token, **kw)

    def nodes(self, i=0):
        """{node: entry} from apiserver i's GET /v1/nodes ({} when it does not answer)."""
        st, body = _status(self.urls[i], "/v1/nodes", self.token)
        if st != 200 or not isinstance(body, dict):
            return {}
        return {n.get("node"): n for n in body.get("nodes", [])}

    def wait_nodes(self, i=0, ready=None, timeout=60):
        """Waits until apiserver i lists the nodes in ready (default: every running edge) with
        state "ready"; returns its node map."""
        want = set(ready if ready is not None else
                   [n for n, e in self.edges.items() if e.running()])

        def ok():
            nodes = self.nodes(i)
            got = {n for n, v in nodes.items() if v.get("state") == "ready"}
            return nodes if want <= got else None

        try:
            return wait_until(ok, timeout, 0.1, f"apiserver {i} to list {sorted(want)} ready")
        except AssertionError as err:
            raise AssertionError(f"{err}\napiserver log:\n"
                                 f"{_tail(self.root / f'apiserver-{i + 1}.log')}") from None

    # -- etcd -------------------------------------------------------------------------------

    def etcd_args(self):
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = self.etcd_url
        return [etcd_binary(), "--name", "dsec", "--data-dir", self.root / "etcd",
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"dsec={peer}",
                "--initial-cluster-token", f"dsec-{self.root.name}",
                "--initial-cluster-state", "new", "--log-outputs", "stderr"]

    def etcd_start(self, timeout=30):
        """Starts etcd (again) on the same data dir and ports; waits for GET /version."""
        if self.etcd_proc is not None and self.etcd_proc.poll() is None:
            raise RuntimeError("etcd is already running")
        self.etcd_proc = _spawn(self.etcd_args(), self.root / "etcd.log", self.root / "etcd.pid")
        deadline = time.monotonic() + timeout
        while _status(self.etcd_url, "/version")[0] != 200:
            if self.etcd_proc.poll() is not None or time.monotonic() > deadline:
                self.etcd_proc.kill()
                self.etcd_proc.wait()
                raise RuntimeError(f"etcd did not answer on {self.etcd_url}; log:\n"
                                   f"{_tail(self.root / 'etcd.log')}")
            time.sleep(0.1)

    def etcd_stop(self, sig=signal.SIGTERM, timeout=20):
        """Stops etcd (SIGTERM, or sig) and waits; returns its exit code."""
        rc = _signal_and_wait(self.etcd_proc, sig, timeout)
        if rc is None and self.etcd_proc is not None:
            self.etcd_proc.kill()
            self.etcd_proc.wait()
            raise AssertionError(f"etcd ignored signal {sig} for {timeout}s")
        return rc

    def etcd_running(self):
        return self.etcd_proc is not None and self.etcd_proc.poll() is None

    # -- edges ------------------------------------------------------------------------------

    def edge_kill(self, name, sig=signal.SIGKILL, timeout=60):
        """Sends sig to edge name; for SIGKILL/SIGTERM waits until it exited (returns its exit
        code), otherwise returns None at once."""
        e = self.edges[name]
        if sig in (signal.SIGKILL, signal.SIGTERM):
            rc = _signal_and_wait(e.proc, sig, timeout)
            if rc is None and e.running():
                raise AssertionError(f"edge {name} still running {timeout}s after {sig!r}")
            return rc
        e.proc.send_signal(sig)
        return None

    def edge_start(self, name, timeout=90):
        """Restarts edge name with the same arguments, port and state dir."""
        e = self.edges[name]
        if e.running():
            raise RuntimeError(f"edge {name} is running")
        return e.launch(timeout)

    # -- apiservers -------------------------------------------------------------------------

    def apiserver_args(self, i):
        return [self.apiserver_bin, "--listen", f"127.0.0.1:{self.apiserver_ports[i]}",
                "--etcd", self.etcd_url, "--token-file", self.root / "cluster.token",
                "--node-token-file", self.root / "node.token", "--port-domain", PORT_DOMAIN,
                "--token-hash-key-file", self.root / "token-hash.key",
                "--audit-log", self.root / f"apiserver-{i + 1}.audit.log"] + \
            self.compat_args(i) + \
            list(self.apiserver_extra)

    def compat_args(self, i):
        if not self.compat_ports:
            return []
        e2b, fusion = self.compat_ports[i]
        return ["--e2b-listen", f"127.0.0.1:{e2b}", "--sandbox-fusion-listen", f"127.0.0.1:{fusion}"]

    @property
    def e2b_urls(self):
        return [f"http://127.0.0.1:{e}" for e, _ in self.compat_ports]

    @property
    def fusion_urls(self):
        return [f"http://127.0.0.1:{f}" for _, f in self.compat_ports]

    def apiserver_start(self, i, timeout=60, wait_nodes=True):
        """Starts apiserver i (0-based) on its port; waits for GET /v1/health 200 and, with
        wait_nodes, until it lists every running edge as ready."""
        p = self.apiserver_procs[i]
        if p is not None and p.poll() is None:
            raise RuntimeError(f"apiserver {i} is running")
        log = self.root / f"apiserver-{i + 1}.log"
        p = _spawn(self.apiserver_args(i), log, self.root / f"apiserver-{i + 1}.pid")
        self.apiserver_procs[i] = p
        deadline = time.monotonic() + timeout
        while _status(self.urls[i], "/v1/health", self.token)[0] != 200:
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                p.wait()
                raise RuntimeError(f"apiserver {i} on {self.urls[i]}: no GET /v1/health 200 "
                                   f"(rc={p.returncode}); log:\n{_tail(log)}")
            time.sleep(0.1)
        if wait_nodes:
            self.wait_nodes(i, timeout=max(1.0, deadline - time.monotonic()))

    def apiserver_kill(self, i, sig=signal.SIGKILL, timeout=20):
        """Sends sig to apiserver i and waits until it exited; returns its exit code."""
        rc = _signal_and_wait(self.apiserver_procs[i], sig, timeout)
        if rc is None and self.apiserver_procs[i] is not None:
            raise AssertionError(f"apiserver {i} still running {timeout}s after {sig!r}")
        return rc

    def apiserver_running(self, i):
        p = self.apiserver_procs[i]
        return p is not None and p.poll() is None

    # -- teardown ---------------------------------------------------------------------------

    def stop(self, check=True):
        """SIGTERM to the apiservers, then every edge at once (60 s), then etcd. Returns
        {part: exit code}; with check, a part that had to be SIGKILLed raises AssertionError
        (after everything was stopped)."""
        codes, late = {}, []
        for i, p in enumerate(self.apiserver_procs):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for i, p in enumerate(self.apiserver_procs):
            if p is not None:
                rc = _signal_and_wait(p, signal.SIGTERM, 15)
                if rc is None:
                    p.kill()
                    p.wait()
                    late.append(f"apiserver {i}")
                codes[f"apiserver-{i + 1}"] = p.returncode
        running = [e for e in self.edges.values() if e.running()]
        for e in running:
            e.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        for e in self.edges.values():
            if e.proc is None:
                continue
            try:
                e.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                e.proc.kill()
                e.proc.wait()
                late.append(f"edge {e.name}")
            codes[f"edge-{e.name}"] = e.proc.returncode
        if self.etcd_proc is not None:
            rc = _signal_and_wait(self.etcd_proc, signal.SIGTERM, 20)
            if rc is None:
                self.etcd_proc.kill()
                self.etcd_proc.wait()
                late.append("etcd")
            codes["etcd"] = self.etcd_proc.returncode
        for f in self.root.glob("*.pid"):
            f.unlink(missing_ok=True)
        if check and late:
            raise AssertionError(f"still running after SIGTERM, killed: {', '.join(late)}")
        return codes

    def processes(self):
        """Processes started from this cluster's dir (etcd, edges, apiservers, or anything
        whose command line or root is under it)."""
        d = str(self.root) + "/"
        out = []
        for pid in edge_harness.pids():
            if pid == os.getpid():
                continue
            try:
                cmd = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
                if d.encode() in cmd or os.readlink(f"/proc/{pid}/root").startswith(d):
                    out.append((pid, cmd.replace(b"\0", b" ")[:100]))
            except OSError:
                pass
        return out

    def residue(self):
        """What is left on the host: a list of strings, empty when everything cleaned up."""
        out, known_pids, known_mounts = [], set(), set()
        for name, e in self.edges.items():
            r = e.residue()
            known_pids.update(r.get("edge_running", []))
            known_pids.update(p for p, _ in r.get("processes", []))
            known_mounts.update(r.get("mounts", []))
            for kind, items in r.items():
                out += [f"edge {name} {kind}: {x}" for x in items]
            out += [f"edge {name} {x}" for x in e.network_residue()]
        if self.etcd_running():
            out.append(f"etcd running: {self.etcd_proc.pid}")
            known_pids.add(self.etcd_proc.pid)
        for i, p in enumerate(self.apiserver_procs):
            if self.apiserver_running(i):
                out.append(f"apiserver {i} running: {p.pid}")
                known_pids.add(p.pid)
        out += [f"process {pid}: {cmd!r}" for pid, cmd in self.processes()
                if pid not in known_pids]
        d = str(self.root)
        out += [f"mount {m}" for m in edge_harness.mountinfo()
                if (m == d or m.startswith(d + "/")) and m not in known_mounts]
        return out

    def shutdown_and_check(self, settle=10):
        """Restarts edges a test killed (so they re-adopt and destroy their sandboxes; needs
        etcd: it is restarted too), stops everything, and returns residue() (polled for up to
        settle seconds: cgroups go a little after their last task)."""
        if self.etcd_proc is not None and not self.etcd_running():
            try:
                self.etcd_start()
            except Exception:  # noqa: BLE001 -- the residue check reports the rest
                pass
        for e in self.edges.values():
            if e.proc is not None and not e.running():
                try:
                    e.launch()
                except Exception:  # noqa: BLE001
                    pass
        problems = []
        try:
            codes = self.stop()
            problems += [f"{k} exit code {v}" for k, v in codes.items()
                         if k.startswith("edge-") and v != 0]
        except AssertionError as err:
            problems.append(str(err))
        deadline = time.monotonic() + settle
        res = self.residue()
        while res and time.monotonic() < deadline:
            time.sleep(0.2)
            res = self.residue()
        return problems + res

    def logs(self, n=40):
        """The last n lines of every log, for a failure message."""
        return "\n".join(f"--- {p.name}\n{_tail(p, n)}" for p in sorted(self.root.glob("*.log")))

    def cleanup(self):
        """Kills whatever still runs, force-cleans edge leftovers and removes the dir (not
        if something is still mounted under it: then AssertionError)."""
        try:
            self.stop(check=False)
        except Exception:  # noqa: BLE001
            pass
        for e in self.edges.values():
            if e.residue():
                e.force_clean()
        for pid, _ in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if self._short_dir is not None:
            shutil.rmtree(self._short_dir, ignore_errors=True)
        d = str(self.root)
        left = [m for m in edge_harness.mountinfo() if m == d or m.startswith(d + "/")]
        if left:
            raise AssertionError(f"mounts left under {d}, not removing it: {left}")
        shutil.rmtree(self.root, ignore_errors=True)

    def short_dir(self):
        """A short temp dir for the edges' unix sockets (removed by cleanup)."""
        if self._short_dir is None:
            self._short_dir = pathlib.Path(tempfile.mkdtemp(prefix="dsec-cl-"))
        return self._short_dir
