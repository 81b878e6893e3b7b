#!/bin/bash
# `dsec run` end to end: exit codes, streaming, limits, errors, and no residue.
# Usage: dsec_run_test.sh PATH/TO/dsec   (needs root; prints SKIPPED otherwise)
set -u
DSEC=${1:?usage: dsec_run_test.sh path/to/dsec}
if [ "$(id -u)" != 0 ]; then echo "[  SKIPPED ] dsec run tests need root"; exit 0; fi
STATE=$(mktemp -d /tmp/dsec-clitest-XXXXXX)
cleanup() { rm -rf "$STATE"; }
trap cleanup EXIT
export DSEC_STATE_DIR=$STATE/state
fails=0
# This state dir's instance id (FNV-1a 64 of its canonical path, as the edge computes it).
inst=$(python3 -c '
import os, sys
h = 1469598103934665603
for c in os.path.realpath(sys.argv[1]).encode():
    h = ((h ^ c) * 1099511628211) & (2**64 - 1)
print(h.to_bytes(8, "big").hex()[:12])' "$STATE/state")
# Agents that exist before we start are not ours (another run, another edge), nor those that
# start meanwhile outside this state dir's cgroups (dsec-<inst>).
preexisting=$(pgrep -x dsec-agent | sort)
our_agents() {
  local p n=0
  for p in $(comm -13 <(echo "$preexisting") <(pgrep -x dsec-agent | sort)); do
    grep -q "dsec-$inst" "/proc/$p/cgroup" 2>/dev/null && n=$((n + 1))
  done
  echo "$n"
}
check() {  # name expected actual
  if [ "$2" == "$3" ]; then echo "ok   $1"; else echo "FAIL $1: expected [$2] got [$3]"; fails=$((fails+1)); fi
}
run() { "$DSEC" --local run "$@" </dev/null; }

out=$(run -- /bin/sh -c 'echo hi; whoami; hostname | cut -c1-9'); check "stdout and identity" $'hi\nsandbox\nsb-local-' "$out"
run -- /bin/sh -c 'exit 42'; check "exit code" 42 $?
out=$("$DSEC" --local --json run -- /bin/sh -c 'echo hi; echo e >&2; exit 3' </dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["exit_code"], r["encoding"], r["stdout"].strip(), r["stderr"].strip())')
check "--json: one result object" "3 utf-8 hi e" "$out"
run -- /bin/sh -c 'kill -KILL $$'; check "killed by signal" 137 $?
out=$(echo "streamed stdin" | "$DSEC" --local run -- tr a-z A-Z); check "stdin" "STREAMED STDIN" "$out"
out=$(head -c 2000000 /dev/zero | "$DSEC" --local run -- wc -c); check "large stdin" 2000000 "$out"
err=$(run -- /bin/sh -c 'echo oops >&2' 2>&1 >/dev/null); check "stderr" oops "$err"
run --timeout 1 -- sleep 30 2>/dev/null; check "timeout exit code" 124 $?
err=$(run --timeout 1 -- sleep 30 2>&1); check "timeout message" "dsec: command timed out after 1 s" "$err"
run --memory 32 --disk 8 -- python3 -c 'x=[]
while True: x.append(b"x" * (1<<20))' 2>/dev/null; check "oom exit code" 137 $?
out=$(run --user root -- id -u); check "--user root" 0 "$out"
out=$(run --env FOO=bar --env X=1 -- /bin/sh -c 'echo $FOO$X'); check "--env" bar1 "$out"
out=$(run --workdir /tmp -- pwd); check "--workdir" /tmp "$out"
out=$(run --no-userns -- id -u); check "--no-userns" 1000 "$out"
run -- nosuchcommand 2>/dev/null; check "command not found" 127 $?

# Bad input: a one-line error and a non-zero exit, never a crash.
for args in "--memory -5 -- true" "--memory abc -- true" "--cpu 0 -- true" "--bogus -- true" \
            "--image nope -- true" "stray -- true" "--timeout 2 extra -- true" "--user nobody-here -- true" "--env NOEQUALS -- true" "--tty maybe -- true"; do
  # shellcheck disable=SC2086
  err=$("$DSEC" --local run $args 2>&1 </dev/null); rc=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ $rc -ne 0 ] && [ "$lines" == 1 ] && [[ "$err" == dsec:* ]]; then echo "ok   bad input: $args"
  else echo "FAIL bad input: $args -> rc=$rc: $err"; fails=$((fails+1)); fi
done
"$DSEC" --local run 2>/dev/null; [ $? -ne 0 ] && echo "ok   no command" || { echo "FAIL no command"; fails=$((fails+1)); }

# Nothing left behind: no sandbox dirs, cgroups, agents.
left=$(ls "$STATE/state/sandboxes" 2>/dev/null | wc -l); check "no sandbox dirs left" 0 "$left"
agents=$(our_agents); check "no agents left" 0 "$agents"
cg=$(ls -d /sys/fs/cgroup/*/dsec-"$inst"/sb-* /sys/fs/cgroup/dsec-"$inst"/sb-* 2>/dev/null | wc -l)
check "no sandbox cgroups left" 0 "$cg"
parents=$(ls -d /sys/fs/cgroup/*/dsec-"$inst" /sys/fs/cgroup/dsec-"$inst" 2>/dev/null | wc -l)
check "parent cgroups removed" 0 "$parents"

# A killed `dsec run` leaves an orphan; the next run cleans it up.
"$DSEC" --local run -- sleep 60 </dev/null >/dev/null 2>&1 &
pid=$!
for _ in $(seq 50); do [ "$(ls "$STATE/state/sandboxes" 2>/dev/null | wc -l)" -ge 1 ] && break; sleep 0.1; done
sleep 0.3
kill -9 $pid; wait $pid 2>/dev/null
run -- true
left=$(ls "$STATE/state/sandboxes" 2>/dev/null | wc -l); check "orphan of a killed run cleaned" 0 "$left"
# The killed agent was re-parented to the host's init, which reaps it in its own time.
for _ in $(seq 50); do [ "$(our_agents)" == 0 ] && break; sleep 0.1; done
agents=$(our_agents); check "orphan agent gone" 0 "$agents"

# `dsec bench` hands every argument to bench/run (found from the binary's checkout).
out=$("$DSEC" bench --help 2>&1); rc=$?
check "bench --help exit" 0 "$rc"
check "bench --help is bench/run's" 1 "$(grep -c '^Usage: bench/run' <<<"$out")"
err=$("$DSEC" bench --no-such-option 2>&1); rc=$?
check "bench bad option exit" 2 "$rc"
check "bench bad option message" "bench/run: unknown option --no-such-option (see --help)" "$err"

if [ $fails -ne 0 ]; then echo "$fails failed"; exit 1; fi
echo "all passed"
