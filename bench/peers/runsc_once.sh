#!/bin/sh
# One gVisor container lifecycle: `runsc run` (create, start, wait, delete) of the same OCI
# bundle crun runs (bench/peers/crun_bundle.py: host / read-only, memory/pids/cpu limits), on
# the ptrace platform (no KVM here) with no network. runsc makes (and removes) the cgroups
# dsec-bench-runsc-[<$DSEC_BENCH_TAG>-]<pid> from the bundle's limits. State goes to STATE_DIR, not /var/run/runsc.
# Must run where the bundle's rootfs has the host / bound on it (bench/run's private mount
# namespace). Usage: runsc_once.sh BUNDLE STATE_DIR
exec runsc --root "$2" --platform=ptrace --network=none run --bundle "$1" "dsec-bench-runsc-${DSEC_BENCH_TAG:+$DSEC_BENCH_TAG-}$$"
