#!/bin/sh
# One crun container lifecycle (create -> run /bin/true -> delete). Must run in a private
# mount namespace without the empty cgroup2 mount (see bench/run).
exec crun --cgroup-manager=cgroupfs run --bundle "$1" "dsecbench-$$"
