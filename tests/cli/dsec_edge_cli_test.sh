#!/bin/bash
# The dsec CLI against a live dsec-edge: every edge command, --json, exit codes, cp of files and
# trees (modes, symlinks), persistent shell sessions, `run` through the edge, function calls and
# pools (fn, pool, create --pool), bad input (one line, non-zero exit), and nothing left behind.
# Usage: dsec_edge_cli_test.sh PATH/TO/dsec PATH/TO/dsec-edge   (needs root; SKIPPED otherwise)
set -u
DSEC=${1:?usage: dsec_edge_cli_test.sh path/to/dsec path/to/dsec-edge}
EDGE=${2:?usage: dsec_edge_cli_test.sh path/to/dsec path/to/dsec-edge}
if [ "$(id -u)" != 0 ]; then echo "[  SKIPPED ] dsec edge CLI tests need root"; exit 0; fi
T=$(mktemp -d /tmp/dsec-edgecli-XXXXXX)
edge_pid=
cleanup() {
  if [ -n "$edge_pid" ]; then kill -TERM "$edge_pid" 2>/dev/null; wait "$edge_pid" 2>/dev/null; fi
  rm -rf "$T"
}
trap cleanup EXIT
fails=0
check() {  # name expected actual
  if [ "$2" == "$3" ]; then echo "ok   $1"; else echo "FAIL $1: expected [$2] got [$3]"; fails=$((fails+1)); fi
}
one_line_error() {  # name rc stderr
  local lines; lines=$(printf '%s\n' "$3" | grep -c .)
  if [ "$2" -ne 0 ] && [ "$lines" == 1 ] && [[ "$3" == dsec:* ]]; then echo "ok   error: $1"
  else echo "FAIL error: $1 -> rc=$2: $3"; fails=$((fails+1)); fi
}

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# No sandbox networking: it would NAT to this machine's real uplink (tests/integration/
# test_network.py tests it in namespaces of its own).
# (port_domain: dsec port --signed prints the host-based form; curl resolves it with --connect-to.)
echo '{"network": false, "port_domain": "ports.cli.test"}' >"$T/config.json"
"$EDGE" --listen 127.0.0.1:"$port" --socket "$T/edge.sock" --state-dir "$T/state" \
  --token-file "$T/tokens" --config "$T/config.json" --log-level warn >"$T/edge.out" 2>"$T/edge.err" &
edge_pid=$!
for _ in $(seq 100); do grep -q "dsec-edge ready" "$T/edge.out" && break; sleep 0.1; done
if ! grep -q "dsec-edge ready" "$T/edge.out"; then echo "FAIL edge did not start"; cat "$T/edge.err"; exit 1; fi
export DSEC_URL="unix://$T/edge.sock"
D() { "$DSEC" "$@"; }

id=$(D create --label job=clitest --memory 256); check "create prints an id" 1 "$(echo "$id" | grep -c '^sb-')"
out=$(D ls --label job=clitest | awk 'NR>1 {print $1, $2}'); check "ls" "$id running" "$out"
out=$(D ls --json --label job=clitest | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["sandboxes"]))'); check "ls --json" 1 "$out"
out=$(D get "$id" --json | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["state"], r["limits"]["memory_mb"])'); check "get --json" "running 256" "$out"
out=$(D get "$id" --stats | grep -c '^memory_current'); check "get --stats" 1 "$out"
out=$(D ls --label job=clitest | awk 'NR==1 {print $3, $7, $8, $11} NR==2 {print $3, $7, $8, $11}' | tr '\n' ' ')
check "ls shows kind, disk, network, idle ttl" "KIND DISK NETWORK IDLE container 256M none - " "$out"
out=$(D ls --kind container --label job=clitest | awk 'NR>1 {print $1}'); check "ls --kind container" "$id" "$out"
out=$(D ls --kind microvm --label job=clitest | awk 'NR>1' | grep -c .); check "ls --kind microvm" 0 "$out"
out=$(D get "$id" | awk '$1 == "KIND:" {print $2}'); check "get shows the kind" container "$out"
out=$(D stats "$id" | grep -c '^exec_count: '); check "stats" 1 "$out"
out=$(D stats "$id" | awk '$1 == "memory_limit:" || $1 == "disk_limit:" {print $2, $3}' | tr '\n' ' ')
check "stats in human units: the limits as created" "256 MiB 256 MiB " "$out"
out=$(D stats "$id" --json | python3 -c 'import json,sys; print("network_denied" in json.load(sys.stdin))'); check "stats --json" True "$out"
out=$(D exec --json "$id" -- sh -c 'echo hi; echo oops >&2; exit 3' | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["exit_code"], r["stdout"].strip(), r["stderr"].strip())')
check "exec --json" "3 hi oops" "$out"
out=$(D exec --json "$id" -- sh -c 'printf "\\377"' | python3 -c 'import json,sys,base64; r=json.load(sys.stdin); print(r["encoding"], base64.b64decode(r["stdout"]).hex())')
check "exec --json, output not UTF-8" "base64 ff" "$out"
err=$(echo ignored | D exec "$id" -- cat 2>&1 >/dev/null); check "piped stdin without -i is named" 1 "$(echo "$err" | grep -c 'stdin is not sent without -i')"
D update "$id" --ttl 7200 --label stage=2 --idle-ttl 600 >/dev/null; check "update" 0 $?
out=$(D get "$id" --json | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["labels"]["stage"], r["idle_ttl_s"])'); check "update applied" "2 600" "$out"
D update "$id" --label stage= >/dev/null
D update "$id" --ttl 0 >/dev/null; check "update --ttl 0" 0 $?
out=$(D get "$id" --json | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["ttl_s"], r["expires_at"])'); check "--ttl 0 is no TTL" "0 None" "$out"
err=$(D update "$id" --ttl -5 2>&1); one_line_error "negative --ttl names the flag" $? "$err"
check "negative --ttl names the flag, not ttl_s" 1 "$(echo "$err" | grep -c -- '--ttl')"
D update "$id" --ttl 7200 >/dev/null
out=$(D get "$id" --json | python3 -c 'import json,sys; print("stage" in json.load(sys.stdin)["labels"])'); check "update removes a label" False "$out"
out=$(D pause --job clitest); check "pause --job" "paused 1 sandboxes of job clitest" "$out"
out=$(D get "$id" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])'); check "paused by job" paused "$out"
out=$(D resume --job clitest); check "resume --job" "resumed 1 sandboxes of job clitest" "$out"
err=$(D pause 2>&1); one_line_error "pause with nothing" $? "$err"
err=$(D update "$id" --network open 2>&1); one_line_error "network on an edge without it" $? "$err"

out=$(D exec "$id" -- sh -c 'echo out; echo err >&2; exit 7' 2>"$T/err"); rc=$?
check "exec stdout" out "$out"; check "exec stderr" err "$(cat "$T/err")"; check "exec exit code" 7 $rc
out=$(D exec --cwd /tmp --env A=1 "$id" -- sh -c 'echo $(pwd)$A'); check "exec --cwd --env" /tmp1 "$out"
D exec "$id" -- sh -c 'kill -KILL $$'; check "exec killed by signal" 137 $?
D exec --timeout 1 "$id" -- sleep 30 2>/dev/null; check "exec timeout" 124 $?
out=$(D exec "$id" -- sh -c 'head -c 3000000 /dev/zero' | wc -c); check "exec large output" 3000000 "$out"
# Piped output streams: the command waits for a file that the reader makes only once it has
# the first line (a CLI that held output back until the exit prints not-seen, after 10 s).
out=$(D exec "$id" -- sh -c 'echo first; for i in $(seq 100); do [ -e /tmp/go ] && break; sleep 0.1; done
  [ -e /tmp/go ] && echo seen || echo not-seen' | while read -r l; do
  echo "$l"; [ "$l" = first ] && D exec "$id" -- touch /tmp/go; done | tr '\n' ' ')
check "exec streams piped output" "first seen " "$out"
out=$(echo streamed | D exec -i "$id" -- tr a-z A-Z); check "exec -i stdin" STREAMED "$out"
out=$(head -c 1000000 /dev/zero | D exec -i "$id" -- wc -c); check "exec -i large stdin" 1000000 "$out"
# On a terminal, a command's control sequences are shown, not obeyed (clear screen, cursor up,
# a C1 CSI); piped, and with --raw, they pass as they are.
out=$(python3 - "$DSEC" "$id" <<'PY'
import os, pty, sys
for extra in ([], ["--raw"]):
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(sys.argv[1], [sys.argv[1], "exec", *extra, sys.argv[2], "--",
                               "printf", "\\033[2J\\033[1Afake\\302\\233ok\\n"])
    buf = b""
    while True:
        try:
            d = os.read(fd, 4096)
        except OSError:
            break
        if not d:
            break
        buf += d
    os.waitpid(pid, 0)
    print(repr(buf.replace(b"\r\n", b"\n")))
PY
)
check "exec on a terminal shows escapes" "b'^[[2J^[[1AfakeM-^[ok\\n'
b'\\x1b[2J\\x1b[1Afake\\xc2\\x9bok\\n'" "$out"
out=$(D exec "$id" -- printf '\033[2J' | od -An -c | tr -d ' '); check "exec piped keeps escapes" '033[2J' "$out"
out=$(printf 'cd /tmp\nexport X=42\necho $(pwd)$X\n' | D shell "$id"); check "shell keeps cwd and env" /tmp42 "$out"
printf 'true\nexit 3\n' | D shell "$id" >/dev/null; check "shell exit code" 3 $?

# On a terminal: an interactive login shell on a pty that takes input (driven through a pty here).
out=$(python3 - "$DSEC" "$id" <<'PY'
import os, pty, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], [sys.argv[1], "shell", sys.argv[2]])
os.write(fd, b"cd /tmp; echo answer=$((6*7)) $(tty | cut -c1-8) $PWD; exit 3\n")
buf, deadline = b"", time.time() + 20
while time.time() < deadline:
    r, _, _ = select.select([fd], [], [], 0.5)
    if r:
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        buf += data
_, status = os.waitpid(pid, 0)
line = [l for l in buf.decode(errors="replace").splitlines() if l.startswith("answer=")]
print(line[-1].strip() if line else "no answer", os.waitstatus_to_exitcode(status))
PY
)
check "interactive shell on a terminal" "answer=42 /dev/pts /tmp 3" "$out"

mkdir -p "$T/tree/sub" && echo hi >"$T/tree/f" && chmod 750 "$T/tree/f" && ln -s f "$T/tree/link" && chmod 700 "$T/tree/sub"
D cp "$T/tree" "$id:/workspace/"; check "cp dir up" 0 $?
out=$(D exec "$id" -- stat -c '%a %U %N' /workspace/tree/f /workspace/tree/link /workspace/tree/sub | tr '\n' ';')
check "cp dir up: modes, owner, symlink" "750 sandbox '/workspace/tree/f';777 sandbox '/workspace/tree/link' -> 'f';700 sandbox '/workspace/tree/sub';" "$out"
D cp "$id:/workspace/tree" "$T/back"; check "cp dir down" 0 $?
check "cp dir down: file" hi "$(cat "$T/back/f")"
check "cp dir down: symlink" f "$(readlink "$T/back/link")"
check "cp dir down: mode" 750 "$(stat -c %a "$T/back/f")"
head -c 500000 /dev/urandom >"$T/blob"; chmod 640 "$T/blob"
D cp "$T/blob" "$id:/workspace/deep/er/blob"; check "cp file up (parents made)" 0 $?
D cp "$id:/workspace/deep/er/blob" "$T/blob2"; check "cp file down" 0 $?
check "cp round trip bytes" "$(sha256sum <"$T/blob")" "$(sha256sum <"$T/blob2")"
check "cp round trip mode" 640 "$(stat -c %a "$T/blob2")"

D pause "$id" >/dev/null; check "pause" paused "$(D get "$id" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')"
D resume "$id" >/dev/null; check "resume" running "$(D get "$id" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')"

# run through the edge (TCP with a token this time), exit codes and stdin.
out=$(echo via-edge | DSEC_URL=http://127.0.0.1:$port DSEC_TOKEN=$(head -1 "$T/tokens") "$DSEC" run -- cat); check "run through the edge" via-edge "$out"
DSEC_URL=http://127.0.0.1:$port DSEC_TOKEN=$(head -1 "$T/tokens") "$DSEC" run -- sh -c 'exit 5' </dev/null; check "run exit code" 5 $?
out=$(DSEC_URL=http://127.0.0.1:$port DSEC_TOKEN=$(head -1 "$T/tokens") "$DSEC" --json run -- sh -c 'echo out; exit 4' </dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["exit_code"], r["encoding"], r["stdout"].strip())')
check "run --json through the edge" "4 utf-8 out" "$out"
# A signed port URL: no token needed to use it (nothing listens on 8000: the edge's 502, not 401).
D exec "$id" -- sh -c 'cd /tmp && echo signed > s.txt && (python3 -m http.server 8000 >/dev/null 2>&1 &)' >/dev/null
url=$(DSEC_URL=http://127.0.0.1:$port DSEC_TOKEN=$(head -1 "$T/tokens") "$DSEC" port "$id" 8000 s.txt --signed --ttl 60)
check "port --signed names the sandbox and port" 1 "$(echo "$url" | grep -c "^http://8000-$id\.ports\.cli\.test:$port/s.txt?dsec_port_token=[0-9]*\.[0-9a-f]*$")"
# curl follows the redirect that trades the token for the host's cookie.
for _ in $(seq 50); do out=$(curl -s -L -b '' --connect-to "8000-$id.ports.cli.test:$port:127.0.0.1:$port" "$url"); [ "$out" = signed ] && break; sleep 0.1; done
check "a signed URL works without a token" signed "$out"
left=$(D ls --label dsec-run=1 | awk 'NR>1' | grep -c .); check "run deletes its sandbox" 0 "$left"

# Function calls on the built-in runtimes: code from -c or a file, input files, stdin, output,
# exit codes, --json.
out=$(D fn --runtime python -c 'print(sum(range(10)))'); check "fn -c" 45 "$out"
printf 'import sys\nprint(open("in/data.txt").read().strip(), sys.stdin.read().upper())\nsys.exit(3)\n' >"$T/prog.py"
mkdir -p "$T/fn" && echo data >"$T/fn/data.txt" && printf abc >"$T/fn/stdin"
out=$(D fn --runtime python --file in/data.txt="$T/fn/data.txt" --stdin-file "$T/fn/stdin" "$T/prog.py"); rc=$?
check "fn FILE with --file and --stdin-file" "data ABC" "$out"; check "fn exit code" 3 $rc
printf 'raise ValueError("boom")\n' >"$T/boom.py"
out=$(D fn --runtime python "$T/boom.py" 2>&1 >/dev/null | grep -c 'File "boom.py", line 1'); check "fn FILE names the code" 1 "$out"
out=$(echo piped | D fn --runtime bash --stdin-file - -c 'tr a-z A-Z; echo err >&2' 2>"$T/err"); check "fn stdin from -" PIPED "$out"
check "fn stderr" err "$(cat "$T/err")"
out=$(echo 'echo code-from-stdin' | D fn --runtime bash -); check "fn code from stdin" code-from-stdin "$out"
out=$(D fn --runtime bash -c 'printf "\000\377"' | od -An -tx1 | tr -d ' '); check "fn binary output" 00ff "$out"
D fn --runtime bash -c 'kill -KILL $$'; check "fn killed by signal" 137 $?
D fn --runtime python --timeout-ms 300 -c 'import time; time.sleep(10)' 2>/dev/null; check "fn timeout" 124 $?
out=$(D fn --json --runtime python -c 'print(1)' | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["runtime"], r["stdout"].strip(), r["exit_code"], r["queue_ms"] >= 0)')
check "fn --json" "python 1 0 True" "$out"

# Pools: the built-in runtimes, a new python pool (preload), an exec pool, changes that keep the
# other fields, a container pool that `create --pool` takes from, and removal.
pool_field() { D pool get "$1" --json | python3 -c "import json,sys; r=json.load(sys.stdin); print($2)"; }
out=$(D pool ls | awk 'NR>1 {print $1, $2}' | tr '\n' ';'); check "pool ls" "bash fncall;python fncall;" "$out"
check "pool get" "python fncall python" "$(pool_field python 'r["name"], r["kind"], r["runtime"]')"
D pool put py2 --runtime python --preload json,csv --min-idle 1 --max 2 >/dev/null; check "pool put (new)" 0 $?
check "pool put fields" "['json', 'csv'] 1 2" "$(pool_field py2 'r["preload"], r["min_idle"], r["max"]')"
out=$(D pool put py2 --max 3 | grep -E '^(preload|max|min_idle):' | tr -s ' ' | tr '\n' ';'); check "pool put keeps the rest" "preload: json,csv;min_idle: 1;max: 3;" "$out"
out=$(D fn --runtime py2 -c 'import sys; print("csv" in sys.modules)'); check "fn on a new pool (preloaded)" True "$out"
D pool put ex --min-idle 0 --max 1 -- /bin/sh -c >/dev/null; check "pool put exec" "exec ['/bin/sh', '-c']" "$(pool_field ex 'r["runtime"], r["command"]')"
out=$(D fn --runtime ex -c 'echo via-exec'); check "fn on an exec pool" via-exec "$out"
D pool put web --kind container --min-idle 1 --max 1 --memory-mb 128 >/dev/null; check "pool put container" 0 $?
for _ in $(seq 100); do [ "$(pool_field web 'r["workers"]["idle"]')" == 1 ] && break; sleep 0.1; done
pid=$(D create --pool web --label job=pooled); check "create --pool" "running 128" "$(D get "$pid" --json | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["state"], r["limits"]["memory_mb"])')"
check "pool counts the take" 1 "$(pool_field web 'r["taken"]')"
D rm "$pid" >/dev/null
out=$(D pool rm py2 ex web); check "pool rm" "py2;ex;web;" "$(echo "$out" | tr '\n' ';')"
out=$(D pool ls --json | python3 -c 'import json,sys; print(sorted(p["name"] for p in json.load(sys.stdin)["pools"]))'); check "pool ls --json" "['bash', 'python']" "$out"

# Bad input: one line on stderr, non-zero exit, the edge keeps serving.
err=$(D get nope 2>&1); one_line_error "unknown sandbox" $? "$err"
err=$(D get 'a/../b' 2>&1); one_line_error "id with .." $? "$err"
err=$(D create --memory -5 2>&1); one_line_error "negative memory" $? "$err"
err=$(D create --image nope 2>&1); one_line_error "unknown image" $? "$err"
err=$(D create --label novalue 2>&1); one_line_error "label without =" $? "$err"
err=$(D exec "$id" 2>&1); one_line_error "exec without command" $? "$err"
err=$(D cp "$T/blob" "$T/blob3" 2>&1); one_line_error "cp without a sandbox side" $? "$err"
err=$(D cp "$id:relative" "$T/x" 2>&1); one_line_error "cp relative sandbox path" $? "$err"
err=$(D cp "$id:/no/such" "$T/x" 2>&1); one_line_error "cp missing source" $? "$err"
err=$(D fn --runtime nope -c x 2>&1); one_line_error "fn unknown runtime" $? "$err"
err=$(D fn --runtime python 2>&1); one_line_error "fn without code" $? "$err"
err=$(D fn -c 'print(1)' 2>&1); one_line_error "fn without --runtime" $? "$err"
err=$(D fn --runtime python -c x "$T/prog.py" 2>&1); one_line_error "fn with -c and a FILE" $? "$err"
err=$(D fn --runtime python "$T/nothing.py" 2>&1); one_line_error "fn missing FILE" $? "$err"
err=$(D fn --runtime python --file novalue -c x 2>&1); one_line_error "fn --file without =" $? "$err"
err=$(D fn --runtime python --file a="$T/nothing" -c x 2>&1); one_line_error "fn --file missing" $? "$err"
err=$(D fn --runtime python --memory-mb 1000000 -c x 2>&1); one_line_error "fn memory over the pool's" $? "$err"
err=$(D fn --runtime python --timeout-ms 0 -c x 2>&1); one_line_error "fn zero timeout" $? "$err"
err=$(D pool get nope 2>&1); one_line_error "pool get unknown" $? "$err"
err=$(D pool put bad --runtime ruby 2>&1); one_line_error "pool put bad runtime" $? "$err"
err=$(D pool put bad 2>&1); one_line_error "pool put without runtime" $? "$err"
err=$(D pool put bad --runtime python --min-idle 5 --max 2 2>&1); one_line_error "pool put min_idle > max" $? "$err"
err=$(D pool rm nope 2>&1); one_line_error "pool rm unknown" $? "$err"
err=$(D create --pool nope 2>&1); one_line_error "create from an unknown pool" $? "$err"
err=$(D create --pool python 2>&1); one_line_error "create from an fncall pool" $? "$err"
err=$(DSEC_URL=http://127.0.0.1:$port DSEC_TOKEN=wrong "$DSEC" ls 2>&1); one_line_error "wrong token" $? "$err"
err=$(DSEC_URL=ftp://x "$DSEC" ls 2>&1); one_line_error "bad DSEC_URL" $? "$err"
err=$(DSEC_URL=unix://$T/nothing.sock "$DSEC" ls 2>&1); one_line_error "no edge there" $? "$err"
check "edge still serving" 1 "$(D ls --json >/dev/null && echo 1)"

# Images: import a directory (sent as a rootfs tar) and an archive, stack them, snapshot, fork.
if [ -x /bin/busybox ]; then
  mkdir -p "$T/rootfs/bin" "$T/rootfs/etc" "$T/layer/srv"
  cp /bin/busybox "$T/rootfs/bin/"
  for a in sh cat ls; do ln "$T/rootfs/bin/busybox" "$T/rootfs/bin/$a"; done
  echo from-dir >"$T/rootfs/etc/motd"
  echo layer >"$T/layer/srv/l.txt"
  tar -C "$T/layer" -czf "$T/layer.tar.gz" .
  check "image import dir" "clibb:1" "$(D image import clibb:1 "$T/rootfs")"
  check "image import tar.gz from stdin" "clilayer:latest" "$(D image import clilayer - <"$T/layer.tar.gz")"
  check "image ls" 3 "$(D image ls | awk 'NR>1' | grep -c '^\(host\|clibb:1\|clilayer:latest\) ')"
  check "image inspect" "1 import" "$(D image inspect clibb:1 | python3 -c 'import json,sys; r=json.load(sys.stdin); print(len(r["layers"]), r["source"])')"
  sid=$(D create --image clibb:1,clilayer --memory 64)
  check "create from a stack" "from-dir layer" "$(D exec "$sid" -- /bin/sh -c 'echo $(cat /etc/motd /srv/l.txt)')"
  D exec "$sid" -- /bin/sh -c 'echo snap > /workspace/s' >/dev/null
  check "snapshot" "clisnap:1" "$(D snapshot "$sid" clisnap:1)"
  forks=$(D fork "$sid" -n 2)
  check "fork prints ids" 2 "$(echo "$forks" | grep -c '^sb-')"
  for f in $forks; do check "fork sees the files" snap "$(D exec "$f" -- /bin/cat /workspace/s)"; D rm "$f" >/dev/null; done
  # A microVM of the same image, where the edge serves them (else 422 saying so).
  if vm=$(D create --kind microvm --image clibb:1 --memory 128 --disk 32 2>"$T/vm.err"); then
    check "create --kind microvm" "microvm from-dir" "$(D get "$vm" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["kind"])') $(D exec "$vm" -- /bin/cat /etc/motd)"
    D rm "$vm" >/dev/null
  elif grep -q "not available on this node" "$T/vm.err"; then
    echo "[  SKIPPED ] create --kind microvm: $(cat "$T/vm.err")"
  else
    check "create --kind microvm" "a microVM" "$(cat "$T/vm.err")"
  fi
  err=$(D create --kind vm 2>&1); one_line_error "create --kind of an unknown kind" $? "$err"
  err=$(D create --kind microvm --image host 2>&1); one_line_error "create --kind microvm on the host image" $? "$err"
  err=$(D image import clibb:1 "$T/rootfs" 2>&1); one_line_error "image import of a taken name" $? "$err"
  err=$(D image import cli-x:1 "$T/nothing" 2>&1); one_line_error "image import of a missing path" $? "$err"
  err=$(D image rm host 2>&1); one_line_error "image rm host" $? "$err"
  err=$(D image inspect nope:1 2>&1); one_line_error "image inspect unknown" $? "$err"
  err=$(D create --image nope:1 2>&1); one_line_error "create from an unknown image" $? "$err"
  err=$(D snapshot "$sid" 'Bad Name' 2>&1); one_line_error "snapshot with a bad name" $? "$err"
  err=$(D fork "$sid" -n 65 2>&1); one_line_error "fork of 65" $? "$err"
  err=$(D fork "$sid" --memory 2>&1); one_line_error "fork of a container's memory" $? "$err"
  D rm "$sid" >/dev/null
  D image rm clibb:1 clilayer clisnap:1; check "image rm" 0 $?
  check "only host left" "host" "$(D image ls | awk 'NR>1 {print $1}')"
  check "no layers left" 0 "$(ls "$T/state/images/layers" | wc -l)"
else
  echo "[  SKIPPED ] image CLI cases: /bin/busybox is missing (busybox-static)"
fi

# The trajectory log: record, preempt, resume (the logged call answered from the log), rm.
tid=$(D create --trajectory cli-traj --checkpoint-every 5 --label job=trajjob)
out1=$(D exec "$tid" -- sh -c 'echo x >> /workspace/n; head -c 9 /dev/urandom | base64')
out=$(D preempt --job trajjob); check "preempt --job" "preempted 1 sandboxes of job trajjob" "$(echo "$out" | head -1)"
check "preempt names the checkpoint" 1 "$(echo "$out" | grep -c "trajectory cli-traj checkpointed at call 1")"
check "trajectory ls" "cli-traj preempted" "$(D trajectory ls | awk '$1 == "cli-traj" {print $1, $2}')"
rid=$(D trajectory resume cli-traj)
out2=$(D exec "$rid" -- sh -c 'echo x >> /workspace/n; head -c 9 /dev/urandom | base64')
check "a resumed call is answered from the log" "$out1" "$out2"
check "then live, nothing ran twice" 1 "$(D exec "$rid" -- sh -c 'wc -l < /workspace/n')"
check "trajectory get" 2 "$(D trajectory get cli-traj | awk '$3 == "POST" {n++} END {print n}')"
err=$(D trajectory rm cli-traj 2>&1); one_line_error "trajectory rm while a sandbox follows it" $? "$err"
err=$(D create --checkpoint-every 3 2>&1); one_line_error "create --checkpoint-every without --trajectory" $? "$err"
err=$(D create --node not-this-node 2>&1); one_line_error "create --node naming another node" $? "$err"
check "create --node names the node" 1 "$(printf '%s' "$err" | grep -c 'not not-this-node')"
err=$(D trajectory get nope 2>&1); one_line_error "trajectory get of an unknown id" $? "$err"
D rm "$rid" >/dev/null
for i in $(seq 50); do D trajectory rm cli-traj 2>/dev/null && break; sleep 0.2; done
check "trajectory rm" 0 "$(D trajectory ls | awk 'NR>1' | grep -c cli-traj)"

D rm "$id" >/dev/null; check "rm" 0 $?
err=$(D rm "$id" 2>&1); one_line_error "rm twice" $? "$err"
D rm -f "$id"; check "rm -f of a missing id" 0 $?
D create --count 3 --label job=bulk >/dev/null
out=$(D rm --job bulk); check "rm --job" "deleted 3 sandboxes of job bulk" "$out"
check "nothing left" 0 "$(D ls | awk 'NR>1' | grep -c .)"

kill -TERM "$edge_pid"; wait "$edge_pid"; check "edge exits cleanly on SIGTERM" 0 $?
edge_pid=
check "no sandbox dirs left" 0 "$(ls "$T/state/sandboxes" 2>/dev/null | wc -l)"
check "no mounts left under the state dir" 0 "$(grep -c "$T" /proc/self/mountinfo)"

if [ $fails -ne 0 ]; then echo "$fails failed"; exit 1; fi
echo "all passed"
