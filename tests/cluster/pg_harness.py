"""A private PostgreSQL for tests (Debian's postgresql-15): its own data dir, a loopback port, a
unix socket dir of its own, run as the `postgres` user (the server refuses root). Standard
library only.

    pg = Postgres.start()          # initdb + postgres; pg.conninfo for libpq
    pg.psql("SELECT 1")            # a statement through psql, its output
    pg.stop(); pg.cleanup()        # SIGTERM (a fast shutdown), then the dir goes
"""

import glob
import os
import pathlib
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

import edge_harness
from cluster_harness import free_port


def pg_bin():
    """The directory of Debian's PostgreSQL server binaries, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return pathlib.Path(found[-1]).parent if found else None


def why_not_runnable():
    if pg_bin() is None:
        return "PostgreSQL not found (apt-get install postgresql-15)"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres user (apt-get install postgresql-15 makes it)"
    if os.geteuid() != 0:
        return "starting a private PostgreSQL as the postgres user needs root"
    return None


class Postgres:
    def __init__(self, root, port):
        self.root = pathlib.Path(root)
        self.port = port
        self.proc = None
        self.user = pwd.getpwnam("postgres")

    @property
    def conninfo(self):
        return f"host=127.0.0.1 port={self.port} dbname=dsec user=dsec"

    def _as_postgres(self):
        os.setgid(self.user.pw_gid)
        os.setgroups([])
        os.setuid(self.user.pw_uid)
        edge_harness._die_with_parent()

    def _run(self, args, check=True):
        return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                              preexec_fn=self._as_postgres, check=check, cwd=self.root)

    @classmethod
    def start(cls, timeout=60):
        reason = why_not_runnable()
        if reason:
            raise RuntimeError(reason)
        root = tempfile.mkdtemp(prefix="dsec-pg-")
        pg = cls(root, free_port())
        try:
            os.chown(root, pg.user.pw_uid, pg.user.pw_gid)
            os.chmod(root, 0o700)
            b = pg_bin()
            # trust on loopback only: the server listens on 127.0.0.1 and its own socket dir.
            pg._run([b / "initdb", "-D", pg.root / "data", "-U", "dsec", "--auth=trust",
                     "--no-sync", "-E", "UTF8"])
            log = open(pg.root / "postgres.log", "ab")
            pg.proc = subprocess.Popen(
                [str(b / "postgres"), "-D", str(pg.root / "data"), "-p", str(pg.port),
                 "-k", str(pg.root), "-c", "listen_addresses=127.0.0.1",
                 "-c", "max_connections=200"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                preexec_fn=pg._as_postgres, cwd=pg.root)
            log.close()
            deadline = time.monotonic() + timeout
            while True:
                r = pg._run([b / "pg_isready", "-h", "127.0.0.1", "-p", pg.port], check=False)
                if r.returncode == 0:
                    break
                if pg.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"postgres did not start:\n{pg.log_tail()}")
                time.sleep(0.2)
            pg._run([b / "createdb", "-h", "127.0.0.1", "-p", pg.port, "-U", "dsec", "dsec"])
        except BaseException:
            pg.stop()
            pg.cleanup()
            raise
        return pg

    def psql(self, sql):
        r = self._run([pg_bin() / "psql", "-h", "127.0.0.1", "-p", self.port, "-U", "dsec",
                       "-d", "dsec", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
        return r.stdout.strip()

    def log_tail(self, n=30):
        try:
            return "\n".join((self.root / "postgres.log").read_text(errors="replace")
                             .splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout=30):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)  # a fast shutdown
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
