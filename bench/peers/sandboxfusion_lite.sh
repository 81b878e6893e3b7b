#!/bin/bash
# One run in the manner of SandboxFusion's "lite" isolation (its sandbox/runners/isolation.py,
# rewritten here as a shell script for the lifecycle benchmark): per run it
#  1. makes cgroups with limits: cgroup v1 memory (512 MiB), pids (256) and cpu (1 core quota)
#     under /sys/fs/cgroup/<ctrl>/dsec-bench-sfl-[<$DSEC_BENCH_TAG>-]<pid>, or one cgroup2 group
#     on a pure v2 host (bench/run sets the tag to find what a run of its own left behind);
#  2. mounts a tmpfs and an overlayfs of the host / with its upper and work dirs on that tmpfs,
#     then /proc, /sys and a recursive bind of /dev into it, and copies /etc/hosts and
#     /etc/resolv.conf in;
#  3. runs the command in the cgroups under `unshare --mount --pid --net --uts --ipc --fork`,
#     chrooted into the overlay;
#  4. tears everything down (unmounts, removes the dirs and cgroups), on every exit path.
# Exit status: the command's, or 125 if the setup failed. Run as root.
# Usage: sandboxfusion_lite.sh CMD [ARGS...]
set -u
id=dsec-bench-sfl-${DSEC_BENCH_TAG:+$DSEC_BENCH_TAG-}$$
base=/tmp/$id
cg=/sys/fs/cgroup
cgroups=()
merged=0 tmpfs=0 running=0  # what is set up, so teardown runs no more tools than it needs
cleanup() {
  if [ $running = 1 ]; then  # interrupted: kill what runs in the cgroups (shell builtins only)
    for g in "${cgroups[@]}"; do
      while read -r p; do kill -9 "$p" 2>/dev/null; done < "$g/cgroup.procs"
    done
    wait 2>/dev/null
  fi
  if [ $merged = 1 ]; then umount -R "$base/merged" 2>/dev/null || umount -R -l "$base/merged"; fi
  if [ $tmpfs = 1 ]; then umount "$base/tmpfs" 2>/dev/null || umount -l "$base/tmpfs"; fi
  # rmdir, never rm -rf: if an unmount failed, the overlay of / (and the /dev bind in it) must
  # not be recursed into; the dirs are then left for the caller's residue check to report.
  rmdir "$base/merged" "$base/tmpfs" "$base" 2>/dev/null
  local g i
  for g in "${cgroups[@]}"; do
    # The pid namespace's init is gone when unshare returns, so the group empties at once;
    # kill any straggler and retry briefly all the same.
    for i in 1 2 3 4 5 6 7 8 9 10; do
      rmdir "$g" 2>/dev/null && break
      [ -f "$g/cgroup.procs" ] && xargs -r kill -9 < "$g/cgroup.procs" 2>/dev/null
      sleep 0.01
    done
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
fail() { echo "sandboxfusion_lite: $*" >&2; exit 125; }
[ $# -ge 1 ] || fail "usage: sandboxfusion_lite.sh CMD [ARGS...]"

# 1. cgroups
if [ "$(stat -fc %T "$cg")" = cgroup2fs ]; then
  mkdir "$cg/$id" || fail "mkdir $cg/$id"
  cgroups+=("$cg/$id")
  echo $((512 << 20)) > "$cg/$id/memory.max" && echo 256 > "$cg/$id/pids.max" &&
    echo "100000 100000" > "$cg/$id/cpu.max" || fail "cgroup2 limits"
else
  for ctrl in memory pids cpu; do
    mkdir "$cg/$ctrl/$id" || fail "mkdir $cg/$ctrl/$id"
    cgroups+=("$cg/$ctrl/$id")
  done
  echo $((512 << 20)) > "$cg/memory/$id/memory.limit_in_bytes" &&
    echo 256 > "$cg/pids/$id/pids.max" &&
    echo 100000 > "$cg/cpu/$id/cpu.cfs_period_us" &&
    echo 100000 > "$cg/cpu/$id/cpu.cfs_quota_us" || fail "cgroup v1 limits"
fi

# 2. overlay root on a tmpfs upper
mkdir -p "$base/tmpfs" "$base/merged" || fail "mkdir $base"
mount -t tmpfs tmpfs "$base/tmpfs" || fail "mount tmpfs"
tmpfs=1
mkdir "$base/tmpfs/upper" "$base/tmpfs/work" || fail "mkdir upper/work"
mount -t overlay overlay \
  -o "lowerdir=/,upperdir=$base/tmpfs/upper,workdir=$base/tmpfs/work" "$base/merged" ||
  fail "mount overlay"
merged=1
mount -t proc proc "$base/merged/proc" || fail "mount proc"
mount -t sysfs sysfs "$base/merged/sys" || fail "mount sysfs"
mount --rbind /dev "$base/merged/dev" || fail "bind /dev"
cp /etc/hosts /etc/resolv.conf "$base/merged/etc/" 2>/dev/null || fail "copy /etc files"

# 3. run: a subshell joins the cgroups, then becomes unshare (which forks the command as PID 1
#    of a new pid namespace, in new mount/net/uts/ipc namespaces, chrooted into the overlay).
#    It runs in the background so that a signal to this script is handled at once (the trap
#    kills everything in the cgroups), not after the command ends.
(
  for g in "${cgroups[@]}"; do echo "$BASHPID" > "$g/cgroup.procs" || exit 125; done
  exec unshare --mount --pid --net --uts --ipc --fork --kill-child chroot "$base/merged" "$@"
) <&0 &  # (<&0: keep stdin, which a background job would lose)
running=1
wait $!
rc=$?
running=0
exit $rc
