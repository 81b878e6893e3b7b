#!/bin/bash
# The dsec CLI against a live dsec-edge: every edge command, --json, exit codes, cp of files and
# trees (modes, symlinks), persistent shell sessions, `run` through the edge, bad input (one
# line, non-zero exit), and nothing left behind.
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
"$EDGE" --listen 127.0.0.1:"$port" --socket "$T/edge.sock" --state-dir "$T/state" \
  --token-file "$T/tokens" --log-level warn >"$T/edge.out" 2>"$T/edge.err" &
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

out=$(D exec "$id" -- sh -c 'echo out; echo err >&2; exit 7' 2>"$T/err"); rc=$?
check "exec stdout" out "$out"; check "exec stderr" err "$(cat "$T/err")"; check "exec exit code" 7 $rc
out=$(D exec --cwd /tmp --env A=1 "$id" -- sh -c 'echo $(pwd)$A'); check "exec --cwd --env" /tmp1 "$out"
D exec "$id" -- sh -c 'kill -KILL $$'; check "exec killed by signal" 137 $?
D exec --timeout 1 "$id" -- sleep 30 2>/dev/null; check "exec timeout" 124 $?
out=$(D exec "$id" -- sh -c 'head -c 3000000 /dev/zero' | wc -c); check "exec large output" 3000000 "$out"
out=$(echo streamed | D exec -i "$id" -- tr a-z A-Z); check "exec -i stdin" STREAMED "$out"
out=$(head -c 1000000 /dev/zero | D exec -i "$id" -- wc -c); check "exec -i large stdin" 1000000 "$out"
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
left=$(D ls --label dsec-run=1 | awk 'NR>1' | grep -c .); check "run deletes its sandbox" 0 "$left"

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
err=$(DSEC_URL=http://127.0.0.1:$port DSEC_TOKEN=wrong "$DSEC" ls 2>&1); one_line_error "wrong token" $? "$err"
err=$(DSEC_URL=ftp://x "$DSEC" ls 2>&1); one_line_error "bad DSEC_URL" $? "$err"
err=$(DSEC_URL=unix://$T/nothing.sock "$DSEC" ls 2>&1); one_line_error "no edge there" $? "$err"
check "edge still serving" 1 "$(D ls --json >/dev/null && echo 1)"

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
