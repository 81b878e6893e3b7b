#!/bin/bash
# `dsec node ls|get|cordon|uncordon|drain` against a local cluster (scripts/cluster up: etcd,
# 2 edges, 1 apiserver): the table and --json, cordons steering placement, a drain that times
# out (exit 1) and one that completes, bad input and wrong endpoints (one line, non-zero exit),
# and the cluster stopped with nothing left.
# Usage: dsec_node_cli_test.sh PATH/TO/dsec; DSEC_EDGE_BIN and DSEC_APISERVER_BIN name the
# daemons (default: build/release). Needs root and etcd; SKIPPED otherwise.
set -u
DSEC=${1:?usage: dsec_node_cli_test.sh path/to/dsec}
repo=$(cd "$(dirname "$0")/../.." && pwd)
export DSEC_EDGE_BIN=${DSEC_EDGE_BIN:-$repo/build/release/src/edge/dsec-edge}
export DSEC_APISERVER_BIN=${DSEC_APISERVER_BIN:-$repo/build/release/src/apiserver/dsec-apiserver}
if [ "$(id -u)" != 0 ]; then echo "[  SKIPPED ] dsec node CLI tests need root"; exit 0; fi
if ! command -v etcd >/dev/null; then
  echo "[  SKIPPED ] dsec node CLI tests: etcd not found (apt-get install etcd-server etcd-client)"
  exit 0
fi
for b in "$DSEC_EDGE_BIN" "$DSEC_APISERVER_BIN"; do
  if [ ! -x "$b" ]; then echo "[  SKIPPED ] dsec node CLI tests: $b not found"; exit 0; fi
done
# Short: the edges' sockets live under it.
T=$(mktemp -d /tmp/dsec-nodecli-XXXXXX)
C=$T/c
cluster_up=
cleanup() {
  if [ -n "$cluster_up" ]; then "$repo/scripts/cluster" down "$C" >/dev/null 2>&1; fi
  [ -e "$C" ] || rm -rf "$T"
}
trap cleanup EXIT
fails=0
check() {  # name expected actual
  if [ "$2" == "$3" ]; then echo "ok   $1"; else echo "FAIL $1: expected [$2] got [$3]"; fails=$((fails+1)); fi
}
one_line_error() {  # name rc stderr [text the line must contain]
  local lines; lines=$(printf '%s\n' "$3" | grep -c .)
  if [ "$2" -ne 0 ] && [ "$lines" == 1 ] && [[ "$3" == dsec:* ]] && [[ "$3" == *"${4:-}"* ]]; then
    echo "ok   error: $1"
  else echo "FAIL error: $1 -> rc=$2: $3"; fails=$((fails+1)); fi
}

cluster_up=1
if ! "$repo/scripts/cluster" up "$C" --edges 2 --apiservers 1 >"$T/up.out" 2>"$T/up.err"; then
  echo "FAIL scripts/cluster up: $(cat "$T/up.err")"
  exit 1
fi
DSEC_URL=$(sed -n 's/^DSEC_URL=//p' "$T/up.out" | head -n 1)
DSEC_TOKEN=$(sed -n 's/^DSEC_TOKEN=//p' "$T/up.out")
export DSEC_URL DSEC_TOKEN
D() { "$DSEC" "$@"; }
json() { python3 -c "import json,sys; r=json.load(sys.stdin); print($1)"; }

check "ls header" "NODE STATE SANDBOXES MEMORY BACKENDS URL" "$(D node ls | head -n 1 | tr -s ' ')"
check "ls" "n1 ready n2 ready " "$(D node ls | awk 'NR>1 {print $1, $2}' | tr '\n' ' ')"
out=$(D node ls | awk '$1 == "n1" {print ($3 ~ /^0\/[0-9]+$/), ($4 ~ /^[0-9]+\/[0-9]+$/), $5, $6}')
check "ls columns" "1 1 MiB container" "$(echo "$out" | sed 's/container,[a-z,]*/container/')"
check "ls URL" 1 "$(D node ls | awk '$1 == "n2" {print $NF}' | grep -c '^http://127.0.0.1:')"
out=$(D node ls --json | json '" ".join(n["node"] for n in r["nodes"]), r["nodes"][0]["capacity"]["max_sandboxes"] > 0')
check "ls --json" "n1 n2 True" "$out"
check "get" "n2 ready" "$(D node get n2 | json 'r["node"], r["state"]')"
err=$(D node get nope 2>&1); one_line_error "get of an unknown node" $? "$err" "no node nope"

check "cordon" "n1 cordoned" "$(D node cordon n1)"
check "cordoned in ls" cordoned "$(D node ls | awk '$1 == "n1" {print $2}')"
check "cordon --json" cordoned "$(D node cordon n1 --json | json 'r["state"]')"
id=$(D create --memory 256 --label job=nodecli)
check "a create avoids the cordoned node" sb-n2- "${id:0:6}"
D node drain n2 --timeout 1 >"$T/out" 2>"$T/err"; rc=$?
check "drain that times out exits 1" 1 $rc
check "drain that times out says so" \
  "n2: still has 1 sandboxes after 1 s (cordoned; no new placements)" "$(cat "$T/err")"
check "drain that times out prints nothing on stdout" "" "$(cat "$T/out")"
check "draining in ls" draining "$(D node ls | awk '$1 == "n2" {print $2}')"
out=$(D node drain n2 --timeout 0 --json 2>/dev/null | json 'r["drained"], r["state"]')
check "drain --json" "False draining" "$out"
err=$(D create --memory 256 2>&1); one_line_error "create with every node cordoned" $? "$err" "cordoned"
D rm "$id" >/dev/null; check "rm" 0 $?
out=$(D node drain n2 --timeout 30); check "drain" "n2 drained (0 sandboxes)" "$out"
check "drain --json of an empty node" "True" "$(D node drain n2 --json | json 'r["drained"]')"
check "uncordon" "n1 ready" "$(D node uncordon n1)"
check "uncordon a drained node" "n2 ready" "$(D node uncordon n2)"
check "ls after uncordon" "n1 ready n2 ready " "$(D node ls | awk 'NR>1 {print $1, $2}' | tr '\n' ' ')"

err=$(D node cordon nope 2>&1); one_line_error "cordon of an unknown node" $? "$err" "no node nope"
err=$(D node drain nope --timeout 1 2>&1); one_line_error "drain of an unknown node" $? "$err" "no node nope"
err=$(D node drain n1 --timeout -1 2>&1); one_line_error "drain --timeout -1" $? "$err"
err=$(D node get 2>&1); one_line_error "get without a node" $? "$err"
err=$(D node 2>&1); one_line_error "node without a command" $? "$err"
err=$(DSEC_TOKEN=wrong D node ls 2>&1); one_line_error "a wrong token" $? "$err"
err=$(DSEC_URL=unix://$C/edge-n1/edge.sock D node ls 2>&1)
one_line_error "an edge's URL" $? "$err" "dsec-apiserver"

# Projects and tokens (issue 37): an admin makes a project and a member token of it; the
# token is the last line of the output; the member's sandbox is in its project and invisible
# to another's; revoke; rm.
check "project create" "clip" "$(D project create clip)"
err=$(D project create clip 2>&1); one_line_error "project create twice" $? "$err" "exists"
check "project ls" "clip default " "$(D project ls | awk 'NR>1 {print $1}' | tr '\n' ' ')"
tok=$(D token create --project clip --role member alice 2>/dev/null | tail -n 1)
check "token create prints the token last" 1 "$(echo "$tok" | grep -c '^dsec_[a-z2-7]\{43\}$')"
check "token ls" "alice member -" "$(D --project clip token ls | awk 'NR>1 {print $1, $2, $NF}')"
err=$(D token create alice 2>&1); one_line_error "token create without a project" $? "$err" "--project"
mid=$(DSEC_TOKEN=$tok D create --memory 64)
check "a member's sandbox is of its project" clip "$(DSEC_TOKEN=$tok D get "$mid" --json | json 'r["project"]')"
err=$(D --project default get "$mid" 2>&1); one_line_error "another project's sandbox" $? "$err" "not found"
err=$(DSEC_TOKEN=$tok D project create x 2>&1); one_line_error "a member making a project" $? "$err" "needs admin"
# Quotas: set on the project (a member may read them, not set them), a create beyond answered
# with the level named, `none` removing a limit.
out=$(D --project clip quota set --sandboxes 1 --cpu 2.5 | awk '$1 == "sandboxes" || $1 == "cpu" {print $1, $2, $3}' | tr '\n' ' ')
check "quota set" "sandboxes 1 1 cpu 2.5 1 " "$out"
check "quota get (the member)" "LEVEL project/clip" "$(DSEC_TOKEN=$tok D --project clip quota get | head -n 1)"
check "quota get --json" "1" "$(D --project clip quota get --json | json 'r["limits"]["sandboxes"]')"
err=$(DSEC_TOKEN=$tok D create --memory 64 2>&1); one_line_error "a create over the quota" $? "$err" "quota exceeded at project/clip: sandboxes limit 1"
err=$(DSEC_TOKEN=$tok D --project clip quota set --sandboxes 5 2>&1); one_line_error "a member setting a quota" $? "$err" "needs admin"
err=$(D --project clip quota set --sandboxes lots 2>&1); one_line_error "quota set with a bad number" $? "$err" "whole number"
err=$(D --project clip quota set 2>&1); one_line_error "quota set naming nothing" $? "$err" "name a limit"
check "quota set none" "-" "$(D --project clip quota set --sandboxes none | awk '$1 == "sandboxes" {print $2}')"
check "quota get --token" "LEVEL token/clip/alice" "$(D --project clip quota get --token alice | head -n 1)"
check "quota get --org" "LEVEL org" "$(D quota get --org | head -n 1)"
DSEC_TOKEN=$tok D rm "$mid" >/dev/null; check "the member deletes its sandbox" 0 $?
check "token revoke" "alice revoked" "$(D token revoke --project clip alice)"
sleep 1
err=$(DSEC_TOKEN=$tok D ls 2>&1); one_line_error "a revoked token" $? "$err" "invalid token"
check "project rm" "clip removed" "$(D project rm clip)"
err=$(DSEC_URL=unix://$C/edge-n1/edge.sock D project ls 2>&1)
one_line_error "projects on an edge's URL" $? "$err" "dsec-apiserver"

cluster_up=
"$repo/scripts/cluster" down "$C" >"$T/down.out" 2>"$T/down.err"; rc=$?
check "cluster down: stopped, nothing left" "0 gone" "$rc $([ -e "$C" ] && echo kept || echo gone)"
[ -e "$C" ] && cat "$T/down.err"

if [ $fails -ne 0 ]; then echo "$fails failed"; exit 1; fi
echo "all passed"
